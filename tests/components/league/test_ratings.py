"""The payoff table and Elo ratings against the formulas."""

from __future__ import annotations

import json

import pytest

from sfbus_components.league.ratings import (
    INITIAL_RATING,
    Payoff,
    elo_expected,
    elo_update,
    policy_player,
    snapshot_player,
)


def test_elo_expected_and_update_follow_the_formula() -> None:
    assert elo_expected(1000.0, 1000.0) == 0.5
    assert elo_expected(1200.0, 1000.0) == pytest.approx(1 / (1 + 10 ** (-200 / 400)))
    assert elo_expected(1200.0, 1000.0) + elo_expected(1000.0, 1200.0) == pytest.approx(1.0)
    expected = 1 / (1 + 10 ** ((1100 - 1000) / 400))  # 0.3599
    won, lost = elo_update(1000.0, 1100.0, 1.0, 32.0)
    assert won == pytest.approx(1000 + 32 * (1 - expected))
    assert lost == pytest.approx(1100 - 32 * (1 - expected))
    drawn, _ = elo_update(1000.0, 1000.0, 0.5, 32.0)
    assert drawn == 1000.0


def test_a_match_is_counted_in_both_rows_and_moves_both_ratings() -> None:
    payoff = Payoff(k=16.0)
    a, b = policy_player(0), snapshot_player(3)
    assert (a, b) == ("policy:0", "snapshot:3")
    payoff.add_player(b, 1100.0)
    payoff.record(a, b, 1.0)
    payoff.record(a, b, 0.5)
    payoff.record(b, a, 1.0)  # b won: a lost
    assert payoff.table[(a, b)] == [1, 1, 1] and payoff.table[(b, a)] == [1, 1, 1]
    assert payoff.games(a, b) == 3 and payoff.matches == 3
    assert payoff.win_rate(a, b) == pytest.approx((1 + 0.5) / 3)
    assert payoff.win_rate(a, "snapshot:9") is None
    rating_a, rating_b = INITIAL_RATING, 1100.0
    for first, score in ((True, 1.0), (True, 0.5), (False, 1.0)):
        if first:
            rating_a, rating_b = elo_update(rating_a, rating_b, score, 16.0)
        else:
            rating_b, rating_a = elo_update(rating_b, rating_a, score, 16.0)
    assert payoff.ratings[a] == pytest.approx(rating_a)
    assert payoff.ratings[b] == pytest.approx(rating_b)
    with pytest.raises(ValueError, match=r"1, 0\.5 or 0"):
        payoff.record(a, b, 0.7)


def test_pooled_win_rate_weighs_every_game_alike() -> None:
    payoff = Payoff()
    s = snapshot_player(0)
    for _ in range(3):
        payoff.record("policy:0", s, 1.0)
    payoff.record("policy:1", s, 0.0)
    assert payoff.pooled_win_rate(["policy:0", "policy:1"], s) == pytest.approx(3 / 4)
    assert payoff.pooled_win_rate(["policy:2"], s) is None


def test_state_round_trips_through_json() -> None:
    payoff = Payoff(k=8.0)
    payoff.record("policy:0", "snapshot:0", 1.0)
    payoff.record("policy:0", "snapshot:1", 0.0)
    again = Payoff.from_state(json.loads(json.dumps(payoff.state())), k=8.0)
    assert again.table == payoff.table and again.ratings == payoff.ratings
    assert again.matches == 2 and again.k == 8.0


def test_a_copied_policy_takes_its_sources_rating_and_keeps_its_results() -> None:
    payoff = Payoff()
    payoff.record("policy:0", "snapshot:0", 1.0)
    payoff.record("policy:1", "snapshot:0", 0.0)
    payoff.take_rating("policy:1", "policy:0")
    assert payoff.ratings["policy:1"] == payoff.ratings["policy:0"] > INITIAL_RATING
    assert payoff.table[("policy:1", "snapshot:0")] == [0, 0, 1]
