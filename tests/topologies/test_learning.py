"""Learning checks through the full multi-process system, judged by return per env frame."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
TOPOLOGIES = Path(__file__).parents[2] / "topologies"


def _run(topology: str, run_dir: Path, *args: str, timeout: float = 270) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGIES / topology), "--run-dir",
         str(run_dir), *args],
        capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def _progress(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)  # above the run's own limit (270 s), so that one speaks first
def test_cartpole_reaches_195_over_100_episodes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run("cartpole.yaml", run_dir, "--max-frames", "150000")
    best = max((r["policies"]["0"].get("reward", 0.0), r["env_frames"])
               for r in _progress(run_dir) if r["policies"].get("0", {}).get("episodes", 0) >= 100)
    assert best[0] >= 195, f"best 100-episode mean return {best[0]:.1f} within 150k frames"


@pytest.mark.timeout(300)
def test_short_doom_run_trains_and_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run("doom_basic.yaml", run_dir, "--max-frames", "40000", "--set", "num_envs=4",
         "--set", "batch_size=256")
    record = _progress(run_dir)[-1]
    last = record["policies"]["0"]
    assert last["version"] >= 3
    # frames the learner trained on: whole agent steps of 4 frames, not more than were sampled
    # (give or take the one batch whose progress report may still be on its way)
    assert 0 < last["trained_frames"] <= record["env_frames"] + 256 * 4
    assert last["trained_frames"] % 4 == 0
    assert last["episodes"] > 0
    checkpoints = sorted((run_dir / "checkpoints" / "policy_0").glob("checkpoint_*.pt"))
    assert checkpoints, "no checkpoint written"


@pytest.mark.timeout(300)
def test_no_waiting_batch_trains_on_data_at_most_one_version_old(tmp_path: Path) -> None:
    """num_batches_to_accumulate 0: one slot per agent, so a batch holds trajectories started
    after the learner copied the one before, and collection pauses rather than deadlocks."""
    run_dir = tmp_path / "run"
    _run("cartpole.yaml", run_dir, "--max-frames", "40000", "--set", "batch_size=256",
         "--set", "num_batches_to_accumulate=0", "--set", "report_every_s=0.5")
    trained = [r["policies"]["0"] for r in _progress(run_dir)
               if "lag" in r["policies"].get("0", {})]
    assert trained and trained[-1]["version"] >= 20
    assert max(r["lag"] for r in trained) <= 1.0
