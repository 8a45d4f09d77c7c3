"""A CartPole run keeps training while its processes are killed with SIGKILL, one after another.

The slot accounting is checked exactly at the end. Before stopping the run, the test freezes the
inference worker (SIGSTOP): the rollout worker can no longer step, and within a few seconds every
message in flight has landed (the batcher queued every submitted trajectory, the learner trained
every full batch and its releases came back). The run is then stopped, and at their graceful stop
the rollout worker logs its slot audit and the batcher what it holds; nothing moves between the
two, so they must agree: every taken slot is either being filled (the worker's active splits) or
queued in the batcher's unfinished batch, and nothing else is taken, stale or unaccounted for.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from sfbus.procfs import run_children
from tests.kernel.runs import start_run, wait_for

pytestmark = pytest.mark.multiprocess
CARTPOLE = Path(__file__).parents[2] / "topologies" / "cartpole.yaml"
SMALL = ("--set", "num_envs=4", "--set", "batch_size=256", "--set", "report_every_s=0.5",
         "--set", "inference_timeout_s=1", "--set", "appo.num_epochs=1")


def progress(run_dir: Path) -> list[dict]:
    """The progress records written so far."""
    path = run_dir / "progress.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def frames(run_dir: Path) -> int:
    """Env frames of the last record."""
    records = progress(run_dir)
    return records[-1]["env_frames"] if records else 0


def version(run_dir: Path) -> int:
    """Learner version of the last record that has one."""
    found = [r["policies"]["0"]["version"] for r in progress(run_dir)
             if "version" in r["policies"].get("0", {})]
    return found[-1] if found else 0


def kill(run_dir: Path, process: str) -> None:
    """SIGKILL ``process`` and wait until the supervisor started a new one."""
    old = run_children(run_dir)[process]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: run_children(run_dir).get(process, old) != old, 30, f"{process} to restart")


def test_training_goes_on_through_kills_and_slots_add_up(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run = start_run(CARTPOLE, run_dir, *SMALL, "--max-seconds", "150")
    stopped: int | None = None
    try:
        wait_for(lambda: version(run_dir) >= 3, 60, "training to start")
        for process in ("rollout", "inference", "learner"):
            before_frames, before_version = frames(run_dir), version(run_dir)
            kill(run_dir, process)
            wait_for(lambda f=before_frames: frames(run_dir) > f + 2000, 40,
                     f"sampling to go on after killing {process}")
            wait_for(lambda v=before_version: version(run_dir) > v, 40,
                     f"training to go on after killing {process}")
        # Quiesce (see the module docstring), then stop and read the audits.
        stopped = run_children(run_dir)["inference"]
        os.kill(stopped, signal.SIGSTOP)
        time.sleep(3)
        run.send_signal(signal.SIGINT)
        time.sleep(1)
        os.kill(stopped, signal.SIGCONT)
        _out, err = run.communicate(timeout=60)
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        run.kill()
        run.wait()
    assert run.returncode == 130, err[-3000:]
    for process in ("rollout", "inference", "learner"):
        assert f"process {process} exited with code -9; restarting" in err

    records = progress(run_dir)
    assert all(a["env_frames"] <= b["env_frames"] for a, b in itertools.pairwise(records))
    versions = [r["policies"]["0"]["version"] for r in records if "version" in
                r["policies"].get("0", {})]
    assert versions[-1] > versions[0]

    audit = _last(run_dir / "logs" / "rollout.log", r"slot audit: (.*)")
    counts = dict((k, int(v)) for k, v in (pair.split("=") for pair in audit.split()))
    held = int(_last(run_dir / "logs" / "learner.log", r"batcher: holds (\d+) trajectories"))
    assert counts["submitted"] == counts["consumed"] == 0, counts
    assert counts["untracked"] == counts["orphaned"] == counts["stray_filling"] == 0, counts
    assert counts["stale"] == 0, counts
    assert counts["queued"] == held, (counts, held)
    assert counts["taken"] == counts["filling"] + counts["queued"], counts
    assert counts["filling"] % 2 == 0  # whole splits (4 envs in 2 splits of 2)


def _last(path: Path, pattern: str) -> str:
    found = re.findall(pattern, path.read_text())
    assert found, f"no {pattern!r} in {path}"
    return found[-1]


def test_restart_limit_fails_the_run_naming_the_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run = start_run(CARTPOLE, run_dir, *SMALL, "--set", "run.max_restarts=1",
                    "--max-seconds", "120")
    try:
        wait_for(lambda: "inference" in run_children(run_dir) and frames(run_dir) > 0, 60,
                 "the run to start")
        kill(run_dir, "inference")
        os.kill(run_children(run_dir)["inference"], signal.SIGKILL)
        _out, err = run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 1, err[-3000:]
    assert re.search(r"process inference exited with code -9 and was restarted 1 times within "
                     r"60 s; giving up", err), err[-3000:]
