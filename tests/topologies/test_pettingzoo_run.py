"""pettingzoo_simple_spread.yaml through the real CLI: a short run on MPE Simple Spread."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SIMPLE_SPREAD = Path(__file__).parents[2] / "topologies" / "pettingzoo_simple_spread.yaml"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(200)  # above the run's own limit, so that one speaks first
def test_short_simple_spread_run_steps_real_games_and_trains(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(SIMPLE_SPREAD), "--run-dir", str(run_dir),
         "--max-frames", "4000", "--max-seconds", "150", "--set", "num_envs=4",
         "--set", "batch_size=384"],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    assert "reached --max-frames 4000" in done.stderr, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["env_frames"] >= 4000
    policy = last["policies"]["0"]
    assert policy["version"] >= 1  # the learner trained on the agents' steps
    # every agent's 25-step episodes were reported, with MPE's negative distance rewards
    assert policy["episodes"] >= 4000 // 25 // 2 and policy["length"] == 25
    assert math.isfinite(policy["reward"]) and policy["reward"] < 0
