"""A killed VizDoom rollout worker's engine files in /dev/shm go while the run goes on, and a
run leaves none of its own behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from sfbus.procfs import command_lines, run_children
from tests.kernel.runs import start_run, wait_for
from tests.topologies.test_chaos import frames, kill

pytestmark = pytest.mark.multiprocess
DOOM = Path(__file__).parents[2] / "topologies" / "doom_basic.yaml"
SHM = Path("/dev/shm")


def engine_ids(parent: int) -> set[str]:
    """Instance ids of the VizDoom engines started by process ``parent``."""
    ids = set()
    for pid, argv in command_lines().items():
        if "+viz_instance_id" not in argv[:-1]:
            continue
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent:
            ids.add(argv[argv.index("+viz_instance_id") + 1])
    return ids


def files_of(ids: set[str]) -> list[str]:
    """The /dev/shm files of these engine instances."""
    return [n for n in os.listdir(SHM) if n.startswith("ViZDoom") and any(n.endswith(i)
                                                                            for i in ids)]


@pytest.mark.timeout(240)
def test_killed_workers_engine_files_go_at_once_and_the_run_leaves_none(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run = start_run(DOOM, run_dir, "--set", "num_envs=4", "--set", "batch_size=256",
                    "--set", "processes.rollout.replicas=2", "--max-seconds", "150")
    seen: set[str] = set()
    try:
        wait_for(lambda: frames(run_dir) > 0, 90, "sampling to start")
        worker = run_children(run_dir)["rollout.0"]
        killed = engine_ids(worker)
        assert len(killed) == 4 and files_of(killed)
        seen |= killed
        before = frames(run_dir)
        kill(run_dir, "rollout.0")
        wait_for(lambda: not files_of(killed), 30, "the killed engines' files to go")
        wait_for(lambda: frames(run_dir) > before + 1000, 60, "sampling to go on")
        for name in ("rollout.0", "rollout.1"):  # a loaded machine starts engines late
            wait_for(lambda n=name: len(engine_ids(run_children(run_dir)[n])) == 4, 30,
                     f"{name}'s 4 engines")
            seen |= engine_ids(run_children(run_dir)[name])
        run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 130, err[-3000:]
    assert "process rollout.0 exited with code -9; restarting" in err
    assert len(seen) == 12 and files_of(seen) == []
