"""Self-play through real processes: a population of 2 dueling in VizDoom, ranked by win rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.short_runs import records, run_until, stderr_of

pytest.importorskip("vizdoom")

SELFPLAY = Path(__file__).parents[2] / "topologies" / "selfplay_duel.yaml"
WINS_LINE = "self-play wins (winner>loser: matches)"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_selfplay_records_matches_and_ranks_by_win_rate(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    def decided() -> list[dict]:
        return [e for e in records(run_dir, "pbt_history.jsonl")
                if e["event"] in ("keep", "mutation", "exchange")]

    def won_and_logged() -> bool:  # a decision that counted decided matches, and the log line
        return any(e["wins"] for e in decided()) and WINS_LINE in stderr_of(run_dir).read_text()

    # stopped once what is checked below has happened (at most 45 s)
    code, err = run_until(
        SELFPLAY, run_dir, "--max-seconds", "45", "--set", "num_policies=2",
        "--set", "env_kwargs.episode_timeout=400",  # 100-step matches
        "--set", "rollout=16", "--set", "batch_size=64", "--set", "interval=500",
        "--set", "announce_every_s=2", "--set", "model.core_size=64",
        reached=won_and_logged, timeout=140)
    assert code in (0, 130), err[-3000:]  # 130: stopped here, gracefully
    assert " raised " not in err, err[-3000:]

    decisions = decided()
    assert decisions, records(run_dir, "pbt_history.jsonl")
    assert all(e["objective_kind"] == "win_rate" for e in decisions)
    # a win rate is a mean of 0s and 1s; both policies have played
    assert all(set(e["objectives"]) == {"0", "1"} for e in decisions), decisions
    assert all(0.0 <= v <= 1.0 for e in decisions for v in e["objectives"].values())
    # matches were decided and counted by winner and loser
    assert decisions[-1]["wins"], decisions[-1]
    assert set(decisions[-1]["wins"]) <= {"0>0", "0>1", "1>0", "1>1"}
    assert WINS_LINE in err, err[-3000:]
