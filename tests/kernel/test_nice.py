"""A topology's ``nice`` holds against the run's other processes, each in a session of its own:
with autogroup scheduling a process's own nice alone would not (every session a group)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")

BUSY = """
import os, sys, time
os.sched_setaffinity(0, [min(os.sched_getaffinity(0))])
if int(sys.argv[1]):
    from sfbus.child import apply_nice
    apply_nice(int(sys.argv[1]))
end = time.monotonic() + 3
while time.monotonic() < end:
    pass
print(os.times().user + os.times().system)
"""


@pytest.mark.multiprocess
@pytest.mark.skipif(not AUTOGROUP.exists() or AUTOGROUP.read_text().strip() != "1",
                    reason="autogroup scheduling is off on this kernel")
def test_a_niced_process_yields_its_core_to_another_session() -> None:
    # two busy processes on one core, each leading its session as sfbus's children do
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(nice)], start_new_session=True,
                              stdout=subprocess.PIPE, text=True) for nice in (19, 0)]
    niced, plain = (float(p.communicate(timeout=30)[0]) for p in procs)
    assert niced < plain / 4, (niced, plain)  # at equal shares each would have ~1.5 s


def test_the_nice_reaches_the_session_group() -> None:
    code = ("from sfbus.child import apply_nice; apply_nice(7); import os; "
            "print(os.getpriority(os.PRIO_PROCESS, 0)); "
            "print(open('/proc/self/autogroup').read() if os.path.exists('/proc/self/autogroup') "
            "else 'nice 7')")
    out = subprocess.run([sys.executable, "-c", code], start_new_session=True, check=True,
                         capture_output=True, text=True, env={**os.environ}).stdout.split("\n")
    assert out[0] == "7" and out[1].endswith("nice 7"), out
