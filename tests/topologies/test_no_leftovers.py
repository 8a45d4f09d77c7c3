"""A VizDoom run leaves no engine process behind, even after a worker is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from sfbus.procfs import command_lines, run_children
from tests.kernel.runs import segments_of, start_run, wait_for

pytestmark = pytest.mark.multiprocess
DOOM_BASIC = Path(__file__).parents[2] / "topologies" / "doom_basic.yaml"


def vizdoom_engines() -> set[int]:
    """Pids of running VizDoom engine processes."""
    return {pid for pid, argv in command_lines().items() if argv and "vizdoom/vizdoom" in argv[0]}


def test_killed_worker_and_ctrl_c_leave_no_engine(tmp_path: Path) -> None:
    before = vizdoom_engines()
    run_dir = tmp_path / "run"
    run = start_run(DOOM_BASIC, run_dir, "--set", "num_envs=2", "--set", "batch_size=128")
    try:
        wait_for(lambda: len(vizdoom_engines() - before) >= 4, 60, "engines of both workers")
        first = vizdoom_engines() - before
        killed = run_children(run_dir)["rollout.0"]
        os.kill(killed, signal.SIGKILL)
        # The new worker and its own engines: a Ctrl-C before the supervisor has seen the death
        # would end the run as failed (a process that died and was not restarted), rightly.
        wait_for(lambda: run_children(run_dir).get("rollout.0") not in (None, killed), 30,
                 "the worker to restart")
        wait_for(lambda: len(vizdoom_engines() - before - first) >= 2, 60,
                 "the new worker's engines")
        run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, err[-3000:]
    wait_for(lambda: not (vizdoom_engines() - before), 10, "every engine to exit")
    assert run_children(run_dir) == {}
    assert segments_of(run.pid) == []
