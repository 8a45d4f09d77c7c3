"""A topology's ``nice`` holds against the run's other processes, each in a session of its own:
with autogroup scheduling a process's own nice alone would not (every session a group)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")

# Both spin over the same 2 s, from a start the test sets: the niced one's import and set-up
# (unniced, and slow on a loaded machine) must not count, nor a stretch where one spins alone.
BUSY = """
import os, sys, time
os.sched_setaffinity(0, [min(os.sched_getaffinity(0))])
if int(sys.argv[1]):
    from sfbus.child import apply_nice
    apply_nice(int(sys.argv[1]))
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.monotonic()))
before = os.times()
while time.monotonic() < start + 2:
    pass
after = os.times()
print(after.user + after.system - before.user - before.system)
"""


@pytest.mark.multiprocess
@pytest.mark.skipif(not AUTOGROUP.exists() or AUTOGROUP.read_text().strip() != "1",
                    reason="autogroup scheduling is off on this kernel")
def test_a_niced_process_yields_its_core_to_another_session() -> None:
    # two busy processes on one core, each leading its session as sfbus's children do
    start = time.monotonic() + 5  # time for both to import and set up (monotonic: system-wide)
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(nice), str(start)],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
             for nice in (19, 0)]
    niced, plain = (float(p.communicate(timeout=30)[0]) for p in procs)
    assert niced < plain / 4, (niced, plain)  # at equal shares each would have ~1 s


def test_the_nice_reaches_the_session_group() -> None:
    code = ("from sfbus.child import apply_nice; apply_nice(7); import os; "
            "print(os.getpriority(os.PRIO_PROCESS, 0)); "
            "print(open('/proc/self/autogroup').read() if os.path.exists('/proc/self/autogroup') "
            "else 'nice 7')")
    out = subprocess.run([sys.executable, "-c", code], start_new_session=True, check=True,
                         capture_output=True, text=True, env={**os.environ}).stdout.split("\n")
    assert out[0] == "7" and out[1].endswith("nice 7"), out
