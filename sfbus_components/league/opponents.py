"""How a league picks opponents from its pool of snapshots: pure functions of the win rates.

Prioritized fictitious self-play (PFSP, AlphaStar) weighs snapshot ``i`` by ``f(x_i)``, where
``x_i`` is the learners' win rate against it: ``hard`` takes ``(1 - x)^2`` (the snapshots they
still lose to), ``variance`` takes ``x (1 - x)`` (the ones as strong as they are); ``uniform``
weighs every snapshot alike. A snapshot never played counts as ``x = 0.5``. The league draws the
snapshots resident in its opponent slots from these probabilities; the rollout workers' mapping
(:mod:`sfbus_components.league.mapping`) then gives each match the latest policies with the
topology's ratio, else one of the resident snapshots.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Weighting = Literal["uniform", "pfsp_hard", "pfsp_variance"]
UNPLAYED_WIN_RATE = 0.5
"""The win rate assumed against a snapshot not played yet."""


def pfsp_weights(win_rates: np.ndarray, weighting: Weighting) -> np.ndarray:
    """``f(x)`` for each win rate ``x``: 1, ``(1 - x)^2`` or ``x (1 - x)``."""
    x = np.asarray(win_rates, np.float64)
    if weighting == "uniform":
        return np.ones_like(x)
    if weighting == "pfsp_hard":
        return (1.0 - x) ** 2
    if weighting == "pfsp_variance":
        return x * (1.0 - x)
    raise ValueError(f"unknown opponent weighting {weighting!r}")


def opponent_probabilities(win_rates: list[float | None], weighting: Weighting) -> np.ndarray:
    """The chance of each snapshot (``None``: not played yet); uniform where every weight is 0
    (all beaten, or all unbeaten under ``variance``), so a pool is never left unplayed."""
    x = np.array([UNPLAYED_WIN_RATE if r is None else r for r in win_rates], np.float64)
    weights = pfsp_weights(x, weighting)
    total = weights.sum()
    if not total > 0:
        return np.full(len(x), 1.0 / len(x))
    return weights / total


def draw_residents(snapshots: list[int], probabilities: np.ndarray, slots: int,
                   rng: np.random.Generator) -> list[int]:
    """The snapshot to load into each of ``slots`` opponent slots, drawn with replacement."""
    if not snapshots:
        return []
    picks = rng.choice(len(snapshots), size=slots, p=probabilities)
    return [snapshots[i] for i in picks.tolist()]
