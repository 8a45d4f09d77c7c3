"""The short scheduler slice a networked VizDoom engine asks for, read back from the kernel."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from sfbus_components.envs.doom.time_slice import SLICE_NS, request_short_slice


def custom_slices() -> bool:
    """Whether this kernel has EEVDF's custom slices (Linux 6.12+)."""
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (6, 12)


def slice_ns(tid: int) -> int:
    """The scheduler's slice of thread ``tid`` (``se.slice`` in /proc)."""
    with open(f"/proc/{tid}/sched") as f:
        return next(int(line.split(":")[1]) for line in f if line.startswith("se.slice"))


def _niced(policy: int) -> None:
    os.nice(5)
    os.sched_setscheduler(0, policy, os.sched_param(0))


@pytest.mark.skipif(not custom_slices(), reason="custom slices need Linux 6.12+")
@pytest.mark.parametrize("policy", ["SCHED_OTHER", "SCHED_BATCH"])
def test_every_thread_gets_the_short_slice_and_keeps_its_nice_and_policy(policy: str) -> None:
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start()"
    fair = getattr(os, policy)
    child = subprocess.Popen([sys.executable, "-c", code], preexec_fn=lambda: _niced(fair))
    try:
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2:
            pass
        threads = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert all(slice_ns(t) != SLICE_NS for t in threads)  # the default is longer
        request_short_slice(child.pid)
        assert [slice_ns(t) for t in threads] == [SLICE_NS] * len(threads)
        assert all(os.getpriority(os.PRIO_PROCESS, t) == 5 for t in threads)
        assert all(os.sched_getscheduler(t) == fair for t in threads)
    finally:
        child.kill()
        child.wait()


def test_a_process_already_gone_is_no_error() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    request_short_slice(child.pid)
