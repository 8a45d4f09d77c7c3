"""The opponent samplers against their formulas: uniform, PFSP hard and variance."""

from __future__ import annotations

import numpy as np
import pytest

from sfbus_components.league.opponents import (
    UNPLAYED_WIN_RATE,
    draw_residents,
    opponent_probabilities,
    pfsp_weights,
)

RATES = np.array([0.0, 0.1, 0.5, 0.8, 1.0])


def test_pfsp_weights_are_the_formulas() -> None:
    assert pfsp_weights(RATES, "pfsp_hard") == pytest.approx((1 - RATES) ** 2)
    assert pfsp_weights(RATES, "pfsp_variance") == pytest.approx(RATES * (1 - RATES))
    assert pfsp_weights(RATES, "uniform") == pytest.approx(np.ones(5))
    with pytest.raises(ValueError, match="unknown opponent weighting 'hardest'"):
        pfsp_weights(RATES, "hardest")  # type: ignore[arg-type]


def test_probabilities_normalize_the_weights_and_count_unplayed_as_even() -> None:
    rates: list[float | None] = [0.2, None, 0.9]
    x = np.array([0.2, UNPLAYED_WIN_RATE, 0.9])
    hard = (1 - x) ** 2
    assert opponent_probabilities(rates, "pfsp_hard") == pytest.approx(hard / hard.sum())
    variance = x * (1 - x)
    assert opponent_probabilities(rates, "pfsp_variance") == pytest.approx(
        variance / variance.sum())
    assert opponent_probabilities(rates, "uniform") == pytest.approx(np.full(3, 1 / 3))


def test_a_pool_whose_weights_are_all_zero_is_drawn_uniformly() -> None:
    assert opponent_probabilities([1.0, 1.0], "pfsp_hard") == pytest.approx([0.5, 0.5])
    assert opponent_probabilities([0.0, 1.0], "pfsp_variance") == pytest.approx([0.5, 0.5])


def test_residents_are_drawn_with_the_probabilities() -> None:
    rng = np.random.default_rng(0)
    probabilities = np.array([0.7, 0.2, 0.1])
    picks = [s for _ in range(2000) for s in draw_residents([10, 11, 12], probabilities, 2, rng)]
    counts = np.bincount(np.array(picks) - 10, minlength=3) / len(picks)
    assert counts == pytest.approx(probabilities, abs=0.02)
    assert draw_residents([], np.array([]), 2, rng) == []
