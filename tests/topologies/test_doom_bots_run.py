"""doom_deathmatch_bots.yaml through the real CLI: a short run against ZDoom's bots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOPOLOGY = Path(__file__).parents[2] / "topologies" / "doom_deathmatch_bots.yaml"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)  # above the run's own limit, so that one speaks first
def test_short_deathmatch_run_trains_against_bots_and_reports_frags(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # 200-step matches, so that episodes end within the run
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGY), "--run-dir", str(run_dir),
         "--max-frames", "12000", "--max-seconds", "240", "--set", "num_envs=2",
         "--set", "batch_size=256", "--set", "env_kwargs.episode_timeout=800"],
        capture_output=True, text=True, timeout=270)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    policy = records[-1]["policies"]["0"]
    assert records[-1]["env_frames"] >= 12000 and policy["version"] >= 1
    assert policy["episodes"] > 0 and policy["length"] == 200
    # the score is frags, which a match's shaped return (deaths, damage, pickups) is not
    assert "true_reward" in policy and policy["true_reward"] != policy["reward"]
