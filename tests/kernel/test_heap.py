"""keep_freed_memory: a big block freed and allocated again soon costs no page faults, in the
threads of a run's processes too."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from sfbus import child

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

# In a child process: the setting is process-wide and would outlive the test here. A block is
# allocated and freed 30 times (glibc's heap takes a few rounds to settle: 7 here), in the main
# thread or in a thread started after another thread allocated and ended, as a learner's
# training threads follow its process's watcher threads; prints the last allocation's faults.
_PROBE = """
import resource, sys, threading, torch
from sfbus.heap import keep_freed_memory
mode, where, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "keep first":
    assert keep_freed_memory()
earlier = threading.Thread(target=lambda: torch.ones(1 << 16))
earlier.start(); earlier.join()
if mode == "keep after a thread":
    assert keep_freed_memory()
faults = []
def allocate():
    for _ in range(30):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = torch.ones(size, dtype=torch.uint8)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del block
if where == "main":
    allocate()
else:
    worker = threading.Thread(target=allocate); worker.start(); worker.join()
print(faults[-1])
"""


def _faults_of_last_allocation(mode: str, where: str, size: int) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode, where, str(size)],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_a_freed_big_block_is_reused_without_page_faults():
    size = 64 << 20  # above glibc's mmap threshold
    pages = size // 4096
    assert _faults_of_last_allocation("default", "main", size) > pages // 2  # mapped every time
    assert _faults_of_last_allocation("keep first", "main", size) < pages // 20


def test_only_threads_that_allocate_after_the_settings_keep_their_blocks():
    """A float32 learner's activations (71-117 MB) exceed what a thread's own heap holds."""
    size = 96 << 20
    pages = size // 4096
    assert _faults_of_last_allocation("keep after a thread", "thread", size) > pages // 2
    assert _faults_of_last_allocation("keep first", "thread", size) < pages // 20


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
