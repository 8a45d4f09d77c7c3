"""keep_freed_memory: a big block freed and allocated again soon costs no page faults; a run's
processes set it before their first thread."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from sfbus import child

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

# In a child process: the setting is process-wide and would outlive the test here.
_PROBE = """
import resource, sys, torch
from sfbus.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
for _ in range(30):  # glibc's heap takes a few rounds to settle (7 here)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB: above glibc's mmap threshold
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del block
print(faults)
"""


def _faults_of_last_allocation(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


def test_a_freed_big_block_is_reused_without_page_faults():
    pages = (64 << 20) // 4096
    assert _faults_of_last_allocation("default") > pages // 2  # mapped afresh every time
    assert _faults_of_last_allocation("keep") < pages // 20


def test_a_run_process_keeps_freed_memory_before_its_first_thread(monkeypatch, tmp_path):
    events = []
    monkeypatch.setattr(child, "keep_freed_memory", lambda: events.append("heap settings"))
    # (the real watcher would also tie this test process to its parent, or end it)
    monkeypatch.setattr(child, "_die_with_parent", lambda: events.append("watcher thread"))
    monkeypatch.setattr(threading.Thread, "start", lambda self: events.append("thread"))
    monkeypatch.setattr(child.signal, "signal", lambda *args: None)
    monkeypatch.setattr(child, "_configure_logging", lambda *args: None)
    (tmp_path / "logs").mkdir()
    assert child.main([str(tmp_path), "learner"]) == 1  # no run there: the process fails
    assert events and events[0] == "heap settings"
