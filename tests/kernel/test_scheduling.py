"""A topology's ``scheduling: batch`` reaches the process, the threads and the processes it
starts (a rollout process's VizDoom engines), and only that process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sfbus.procfs import run_children
from tests.kernel.runs import start_run, wait_for

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's policies")

STARTS_A_THREAD_AND_A_PROCESS = """
import os, subprocess, sys, threading
from sfbus.child import apply_scheduling
apply_scheduling(sys.argv[1])
seen = []
thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
thread.start()
thread.join()
child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                       capture_output=True, text=True, check=True).stdout
print(os.sched_getscheduler(0), seen[0], int(child))
"""

TWO_PROCESSES = """
settings: {count: 1000000000}
processes:
  sender:
    scheduling: batch
    actors: {sender: {class: tests.kernel.test_flood:FloodSender}}
  receiver: {actors: {receiver: {class: tests.kernel.test_flood:FloodReceiver}}}
connections:
  - {from: sender.sent, to: receiver.on_sent}
"""


@pytest.mark.parametrize(("policy", "expected"), [("batch", "SCHED_BATCH"),
                                                  ("normal", "SCHED_OTHER")])
def test_the_policy_reaches_new_threads_and_processes(policy: str, expected: str) -> None:
    out = subprocess.run([sys.executable, "-c", STARTS_A_THREAD_AND_A_PROCESS, policy],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(getattr(os, expected))] * 3, out


@pytest.mark.multiprocess
def test_only_the_process_that_asks_runs_batch(tmp_path: Path) -> None:
    topology = tmp_path / "two.yaml"
    topology.write_text(TWO_PROCESSES)
    run_dir = tmp_path / "run"
    run = start_run(topology, run_dir)
    try:
        wait_for(lambda: len(run_children(run_dir)) == 2, 30, "both processes to run")
        pids = run_children(run_dir)
        wait_for(lambda: os.sched_getscheduler(pids["sender"]) == os.SCHED_BATCH, 10,
                 "the sender to run batch")
        assert os.sched_getscheduler(pids["receiver"]) == os.SCHED_OTHER
        assert os.sched_getscheduler(run.pid) == os.SCHED_OTHER  # the launcher keeps its own
    finally:
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=60)
