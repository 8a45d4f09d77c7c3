"""PBT ranks by a league's rating when its objective says so; episodes then do not count."""

from __future__ import annotations

import math

import numpy as np

from sfbus_components.pbt.rules import PbtRules, Population


def test_a_league_objective_is_the_last_rating_not_the_episodes() -> None:
    population = Population({0: {"appo.lr": 1e-3}, 1: {"appo.lr": 1e-3}}, PbtRules(),
                            np.random.default_rng(0), objective="league_rating")
    population.add_episode(0, 5.0, 5.0, win=1.0)
    assert population.objectives() == {}
    population.set_rating(0, 1010.0)
    population.set_rating(0, 1030.0)
    population.set_rating(1, 990.0)
    population.set_rating(1, math.nan)  # no snapshot yet: keeps what it had
    population.set_rating(7, 900.0)  # not a policy of the population
    assert population.objectives() == {0: 1030.0, 1: 990.0}
