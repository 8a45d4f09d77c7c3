"""The repeated matrix game: payoffs per seat, what each agent sees, a match's outcome."""

from __future__ import annotations

import numpy as np
import pytest

from sfbus_components.envs.matrix_game import make_matrix_game

ROCK, PAPER, SCISSORS = 0, 1, 2


def test_rounds_pay_each_seat_and_a_match_reports_its_winner() -> None:
    game = make_matrix_game(rounds=3)
    obs = {"obs": np.full((2, 6), 7.0, np.float32)}
    game.reset_into(obs)
    assert not obs["obs"].any()
    rewards, terminated, truncated, infos = game.step_into(np.array([[PAPER], [ROCK]]), obs)
    assert rewards.tolist() == [1.0, -1.0] and not terminated.any() and infos == [{}, {}]
    # each sees its own last action, then the opponent's
    assert obs["obs"][0].tolist() == [0, 1, 0, 1, 0, 0]
    assert obs["obs"][1].tolist() == [1, 0, 0, 0, 1, 0]
    game.step_into(np.array([[ROCK], [ROCK]]), obs)  # a draw: 0 each
    rewards, terminated, truncated, infos = game.step_into(np.array([[ROCK], [SCISSORS]]), obs)
    assert terminated.all() and not truncated.any()
    assert [(i["episode_return"], i["episode_win"], i["episode_opponent"]) for i in infos] == [
        (2.0, 1.0, 1), (-2.0, 0.0, 0)]
    assert not obs["obs"].any()  # the next match starts unseen


def test_a_drawn_match_is_half_a_win_each() -> None:
    game = make_matrix_game(rounds=1)
    obs = {"obs": np.zeros((2, 6), np.float32)}
    game.reset_into(obs)
    *_, infos = game.step_into(np.array([[PAPER], [PAPER]]), obs)
    assert [i["episode_win"] for i in infos] == [0.5, 0.5]
    with pytest.raises(ValueError, match="square matrix"):
        make_matrix_game(payoff=((1.0, 2.0),))
