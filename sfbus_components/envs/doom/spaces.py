"""VizDoom action heads, measurements and reward-shaping terms, as plain tables.

An action space is a tuple of heads, each one categorical choice:

- a button group `(b1, b2, ...)`: index 0 is the no-op, index i presses button i alone;
- a `DeltaHead`: index i sets a delta button (turning) to `values[i]`; Sample Factory's
  `Discretized(n, low, high)` is `DeltaHead.evenly(button, n, low, high)`, whose middle index
  is the no-op.

The buttons a space presses are its heads' buttons in order (`head_buttons`), which is also the
order VizDoom is given them. `simple`, one head over the scenario's own binary buttons, is
`simple_actions`: the space the paper's throughput benchmarks use ("a single discrete action
head").

`full`: the paper's Table A.4, seven heads (12096 joint actions):

| head         | n  | meaning of index 0, 1, 2, ...                                          |
|--------------|----|------------------------------------------------------------------------|
| moving       | 3  | none / forward / backward                                              |
| strafing     | 3  | none / left / right                                                    |
| attacking    | 2  | none / attack                                                          |
| sprinting    | 2  | none / sprint (SPEED)                                                  |
| interaction  | 2  | none / use                                                             |
| weapon       | 8  | none / select weapon slot 1..7                                         |
| horizontal aim | 21 | none / TURN_LEFT_RIGHT_DELTA of -12.5..-1.25, +1.25..+12.5 (1.25 step) |

Measurements are a second observation of game variables beside the image, one `Measurement`
per entry. Two layouts: the paper's (`MEASUREMENTS`, with the `full` space and in duels) and
Sample Factory's (`SF_MEASUREMENTS`, its `DoomAdditionalInput`, on the scenarios it trains).

Reward shaping: named terms (`SHAPING_TERMS`) whose coefficients a scenario or topology sets
(`reward_shaping: {frag: 1.0, ...}`). A term counts what its game variables gained in a step
(or, `*_lost`/`*_spent`, what they lost), each variable weighted, the gain capped per step where
Sample Factory caps it; `weapon_ready` pays per step while a loaded weapon stays selected.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import vizdoom as vzd

B = vzd.Button
V = vzd.GameVariable


# ----- action heads ----------------------------------------------------------------------------

@dataclass(frozen=True)
class DeltaHead:
    """One head over a delta button: index i sets it to `values[i]` (0 presses nothing)."""

    button: vzd.Button
    values: tuple[float, ...]

    @classmethod
    def evenly(cls, button: vzd.Button, n: int, low: float, high: float) -> DeltaHead:
        """`n` values from `low` to `high` in even steps (Sample Factory's `Discretized`)."""
        return cls(button, tuple(low + i * (high - low) / (n - 1) for i in range(n)))


Head = tuple[vzd.Button, ...] | DeltaHead
Choice = tuple[int, float] | None
"""What one index of a head does: (button index in the space's buttons, value), None: no-op."""

# Aim: the 21 values -12.5..12.5 in 1.25 steps (Table A.4), zero moved to index 0 ("no-action").
_AIM = (0.0, *(1.25 * k for k in range(-10, 0)), *(1.25 * k for k in range(1, 11)))
FULL_HEADS: tuple[Head, ...] = (
    (B.MOVE_FORWARD, B.MOVE_BACKWARD), (B.MOVE_LEFT, B.MOVE_RIGHT), (B.ATTACK,), (B.SPEED,),
    (B.USE,), tuple(getattr(B, f"SELECT_WEAPON{k}") for k in range(1, 8)),
    DeltaHead(B.TURN_LEFT_RIGHT_DELTA, _AIM),
)


def head_sizes(heads: tuple[Head, ...]) -> tuple[int, ...]:
    """The number of choices of each head."""
    return tuple(len(h.values) if isinstance(h, DeltaHead) else 1 + len(h) for h in heads)


def head_buttons(heads: tuple[Head, ...]) -> list[vzd.Button]:
    """The buttons the heads press, head by head: the order VizDoom is given them."""
    return [b for h in heads for b in ((h.button,) if isinstance(h, DeltaHead) else h)]


def action_table(heads: tuple[Head, ...]) -> list[list[Choice]]:
    """Per head, per index: the (button index in `head_buttons`, value) it sets, or None."""
    tables: list[list[Choice]] = []
    offset = 0
    for head in heads:
        if isinstance(head, DeltaHead):
            tables.append([(offset, v) if v else None for v in head.values])
            offset += 1
        else:
            tables.append([None, *[(offset + i, 1.0) for i in range(len(head))]])
            offset += len(head)
    return tables


FULL_ACTION_HEADS: tuple[int, ...] = head_sizes(FULL_HEADS)
FULL_BUTTONS: list[vzd.Button] = head_buttons(FULL_HEADS)


def full_action_table() -> list[list[Choice]]:
    """Per head, per index: the (button index, value) it sets in FULL_BUTTONS, or None."""
    return action_table(FULL_HEADS)


def simple_actions(buttons: list[vzd.Button]) -> list[list[float]]:
    """Button vectors of the `simple` space: no-op, then each binary button alone."""
    n = len(buttons)
    table = [[0.0] * n]
    for i, b in enumerate(buttons):
        if not vzd.is_delta_button(b):
            table.append([1.0 if j == i else 0.0 for j in range(n)])
    return table


# ----- measurements ----------------------------------------------------------------------------

class Measurement(NamedTuple):
    """One entry of a measurements vector: `clip(variable * scale, low, high)`."""

    variable: vzd.GameVariable
    scale: float
    low: float = -math.inf
    high: float = math.inf
    default: float = 0.0
    """The variable's value where the game does not report it (see `MeasurementReader`)."""


# What a human sees on the HUD (paper A.3), scaled to about [0, 1].
MEASUREMENTS: list[Measurement] = [
    Measurement(V.HEALTH, 1 / 100, low=0.0), Measurement(V.ARMOR, 1 / 100),
    Measurement(V.SELECTED_WEAPON, 1 / 7), Measurement(V.SELECTED_WEAPON_AMMO, 1 / 50),
    Measurement(V.FRAGCOUNT, 1 / 10), Measurement(V.PLAYER_COUNT, 1 / 8),
    *[Measurement(getattr(V, f"WEAPON{i}"), 1.0) for i in range(1, 8)],
    # Ammo per weapon slot over its usual maximum: bullets 200, shells 50, rockets 50, cells 300.
    *[Measurement(getattr(V, f"AMMO{i}"), 1 / m)
      for i, m in zip(range(2, 8), (200, 50, 200, 50, 300, 300), strict=True)],
]

# Sample Factory's DoomAdditionalInput: 7 figures, then weapon slots 0-7 owned, then their ammo.
# Ammo is over 15 and at most 5 (as DFP); negatives (no weapon selected) read as 0.
_AMMO = {"scale": 1 / 15, "low": 0.0, "high": 5.0}
SF_MEASUREMENTS: list[Measurement] = [
    Measurement(V.SELECTED_WEAPON, 1.0, low=0.0), Measurement(V.SELECTED_WEAPON_AMMO, **_AMMO),
    Measurement(V.HEALTH, 1 / 30, low=0.0), Measurement(V.ARMOR, 1 / 30),
    Measurement(V.USER2, 1 / 10),  # battle's kill count
    Measurement(V.ATTACK_READY, 1.0), Measurement(V.PLAYER_COUNT, 1 / 5, default=1.0),
    *[Measurement(getattr(V, f"WEAPON{i}"), 1.0, low=0.0) for i in range(8)],
    *[Measurement(getattr(V, f"AMMO{i}"), **_AMMO) for i in range(8)],
]


class MeasurementReader:
    """Writes a layout's measurements from a state's game variables, as float32.

    Only the variables in `reported` are read; the others stay at their default (Sample Factory
    reads only what a scenario's cfg lists: battle's has no ARMOR, so its armor input is 0)."""

    def __init__(self, layout: list[Measurement], variables: list[vzd.GameVariable],
                 reported: set[vzd.GameVariable] | None = None) -> None:
        """`variables`: the order of a state's `game_variables`; `reported`: default all."""
        rows = [i for i, m in enumerate(layout)
                if m.variable in variables and (reported is None or m.variable in reported)]
        self._rows = np.array(rows, np.int64)
        self._columns = np.array([variables.index(layout[i].variable) for i in rows], np.int64)
        self._values = np.array([m.default for m in layout])
        self._scale = np.array([m.scale for m in layout])
        self._low = np.array([m.low for m in layout])
        self._high = np.array([m.high for m in layout])
        self.size = len(layout)

    def write(self, game_variables: np.ndarray, out: np.ndarray) -> None:
        """Fill `out` (shape `(size,)`) from one state's game variables."""
        self._values[self._rows] = game_variables[self._columns]
        np.clip(self._values * self._scale, self._low, self._high, out=out, casting="unsafe")


# ----- reward shaping --------------------------------------------------------------------------

@dataclass(frozen=True)
class ShapingTerm:
    """Reward per unit a step changes its variables by: gained, or (`lost`) lost."""

    variables: tuple[tuple[vzd.GameVariable, float], ...]
    """Each variable with its weight."""
    lost: bool = False
    cap: float | None = None
    """The most of one step's gain that counts (Sample Factory: BFG and shotgun damage)."""


def _one(variable: vzd.GameVariable) -> tuple[tuple[vzd.GameVariable, float], ...]:
    return ((variable, 1.0),)


# Sample Factory's weights per weapon slot: pistol 1, shotgun, chaingun and rocket launcher 5,
# plasma gun and BFG 10 (slots 0 and 1 weigh 1).
_WEAPON_WEIGHT = {2: 1.0, 3: 5.0, 4: 5.0, 5: 5.0, 6: 10.0, 7: 10.0}
_WEAPONS = tuple((getattr(V, f"WEAPON{i}"), _WEAPON_WEIGHT.get(i, 1.0)) for i in range(8))
_AMMOS = tuple((getattr(V, f"AMMO{i}"), _WEAPON_WEIGHT.get(i, 1.0)) for i in range(8))
SHAPING_TERMS: dict[str, ShapingTerm] = {
    "frag": ShapingTerm(_one(V.FRAGCOUNT)),
    "frag_lost": ShapingTerm(_one(V.FRAGCOUNT), lost=True),  # a suicide
    "death": ShapingTerm(_one(V.DEATHCOUNT)),
    "hit": ShapingTerm(_one(V.HITCOUNT), cap=5.0),
    "damage": ShapingTerm(_one(V.DAMAGECOUNT), cap=200.0),
    "health": ShapingTerm(_one(V.HEALTH)),
    "health_lost": ShapingTerm(_one(V.HEALTH), lost=True),
    "armor": ShapingTerm(_one(V.ARMOR)),
    "armor_lost": ShapingTerm(_one(V.ARMOR), lost=True),
    "weapon": ShapingTerm(_WEAPONS),
    "weapon_lost": ShapingTerm(_WEAPONS, lost=True),
    "ammo": ShapingTerm(_AMMOS),
    "ammo_spent": ShapingTerm(_AMMOS, lost=True),
}
WEAPON_READY = "weapon_ready"
"""Reward per step in which the selected weapon has ammo and was selected for the last
`WEAPON_READY_STEPS` steps: it keeps an early agent from switching weapons and never firing."""
WEAPON_READY_STEPS = 5
WEAPON_READY_VARIABLES = (V.SELECTED_WEAPON, V.SELECTED_WEAPON_AMMO)

# Sample Factory's deathmatch scheme against bots (its REWARD_SHAPING_DEATHMATCH_V0): a frag
# +1, a suicide -1.5, a death -0.75, small terms for hits, damage and pickups. Its weapon_ready
# is 0.002 for every weapon: its code looks the bonus up under a loop variable left at slot 7.
DEATHMATCH_SHAPING: dict[str, float] = {
    "frag": 1.0, "frag_lost": -1.5, "death": -0.75, "hit": 0.01, "damage": 0.003,
    "health": 0.005, "health_lost": -0.003, "armor": 0.005, "armor_lost": -0.001,
    "weapon": 0.02, "weapon_lost": -0.01, "ammo": 0.0002, "ammo_spent": -0.0001,
    WEAPON_READY: 0.002,
}
# Battle and Battle2: Sample Factory applies the same scheme, but their cfg reports only HEALTH
# and the selected weapon, so these are the terms it amounts to (kills are the game's reward).
BATTLE_SHAPING: dict[str, float] = {
    "health": 0.005, "health_lost": -0.003, WEAPON_READY: 0.002,
}


def shaping_variables(keys: Iterable[str]) -> list[vzd.GameVariable]:
    """Every game variable the shaping terms `keys` read, deduplicated, in their order."""
    found: list[vzd.GameVariable] = []
    for key in keys:
        found += WEAPON_READY_VARIABLES if key == WEAPON_READY else \
            [v for v, _ in SHAPING_TERMS[key].variables]
    return list(dict.fromkeys(found))


def shaping_reward(coefs: dict[str, float], prev: dict[vzd.GameVariable, float],
                   cur: dict[vzd.GameVariable, float]) -> float:
    """Sum over `coefs`' change terms of coefficient x what the step gained or lost."""
    total = 0.0
    for key, coef in coefs.items():
        term = SHAPING_TERMS.get(key)
        if not coef or term is None:
            continue
        for var, weight in term.variables:
            # dead is dead: health below zero counts as zero, as Sample Factory reads it
            delta = cur[var] - prev[var] if var != V.HEALTH else \
                max(cur[var], 0.0) - max(prev[var], 0.0)
            change = -delta if term.lost else delta
            if term.cap is not None:
                change = min(change, term.cap)
            if change > 0:
                total += coef * weight * change
    return total


def check_shaping_keys(coefs: dict[str, float], per_step: bool = True) -> None:
    """Raise ValueError naming unknown reward-shaping keys (`per_step`: `weapon_ready` too)."""
    known = [*SHAPING_TERMS, *([WEAPON_READY] if per_step else [])]
    unknown = sorted(set(coefs) - set(known))
    if unknown:
        raise ValueError(f"unknown reward_shaping keys {unknown}; known: {sorted(known)}")
