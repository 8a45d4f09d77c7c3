"""Self-play through real processes: a population of 2 dueling in VizDoom, ranked by win rate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vizdoom")

SELFPLAY = Path(__file__).parents[2] / "topologies" / "selfplay_duel.yaml"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_selfplay_records_matches_and_ranks_by_win_rate(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(SELFPLAY), "--run-dir", str(run_dir),
         "--max-seconds", "45", "--set", "num_policies=2",
         "--set", "env_kwargs.episode_timeout=400",  # 100-step matches
         "--set", "rollout=16", "--set", "batch_size=64", "--set", "interval=500",
         "--set", "announce_every_s=2", "--set", "model.core_size=64"],
        capture_output=True, text=True, timeout=140)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]

    history = [json.loads(line) for line in (run_dir / "pbt_history.jsonl").read_text()
               .splitlines()]
    decisions = [e for e in history if e["event"] in ("keep", "mutation", "exchange")]
    assert decisions, history
    assert all(e["objective_kind"] == "win_rate" for e in decisions)
    # a win rate is a mean of 0s and 1s; both policies have played
    assert all(set(e["objectives"]) == {"0", "1"} for e in decisions), decisions
    assert all(0.0 <= v <= 1.0 for e in decisions for v in e["objectives"].values())
    # matches were decided and counted by winner and loser
    assert decisions[-1]["wins"], decisions[-1]
    assert set(decisions[-1]["wins"]) <= {"0>0", "0>1", "1>0", "1>1"}
    assert "self-play wins (winner>loser: matches)" in done.stderr, done.stderr[-3000:]
