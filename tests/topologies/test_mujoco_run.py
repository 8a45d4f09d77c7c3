"""mujoco_halfcheetah.yaml through the real CLI: short runs on MuJoCo's HalfCheetah."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HALFCHEETAH = Path(__file__).parents[2] / "topologies" / "mujoco_halfcheetah.yaml"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(200)  # above the run's own limit, so that one speaks first
def test_short_halfcheetah_run_with_the_adaptive_head_and_squashed_actions(
        tmp_path: Path) -> None:
    # 100-step episodes, so that some end (by the time limit: value_bootstrap's case) in the run.
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(HALFCHEETAH), "--run-dir", str(run_dir),
         "--max-frames", "4000", "--max-seconds", "150", "--set", "num_envs=2",
         "--set", "batch_size=256", "--set", "env_kwargs.max_episode_steps=100",
         "--set", "model.adaptive_stddev=true", "--set", "model.action_bounds=squash"],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["env_frames"] >= 4000
    policy = last["policies"]["0"]
    assert policy["version"] >= 1  # the learner trained on HalfCheetah's steps
    assert policy["episodes"] > 0 and policy["length"] == 100.0
    assert all(v == v for v in (policy["reward"], policy["value_loss"], policy["entropy"]))
