"""VizDoom action spaces, measurements and reward-shaping terms, as plain tables.

`simple`: one categorical head over the scenario's own binary buttons: action 0 is no-op and
action i presses button i-1 alone (delta buttons of the scenario are held at 0). This is the
space the paper's throughput benchmarks use ("a single discrete action head").

`full`: the paper's Table A.4, seven independent heads (12096 joint actions). Index 0 of every
head is its no-action, so an all-zero action is a no-op:

| head         | n  | meaning of index 0, 1, 2, ...                                          |
|--------------|----|------------------------------------------------------------------------|
| moving       | 3  | none / forward / backward                                              |
| strafing     | 3  | none / left / right                                                    |
| attacking    | 2  | none / attack                                                          |
| sprinting    | 2  | none / sprint (SPEED)                                                  |
| interaction  | 2  | none / use                                                             |
| weapon       | 8  | none / select weapon slot 1..7                                         |
| horizontal aim | 21 | none / TURN_LEFT_RIGHT_DELTA of -12.5..-1.25, +1.25..+12.5 (1.25 step) |
"""

from __future__ import annotations

import vizdoom as vzd

B = vzd.Button
V = vzd.GameVariable

FULL_ACTION_HEADS: tuple[int, ...] = (3, 3, 2, 2, 2, 8, 21)
FULL_BUTTONS: list[vzd.Button] = [
    B.MOVE_FORWARD, B.MOVE_BACKWARD, B.MOVE_LEFT, B.MOVE_RIGHT, B.ATTACK, B.SPEED, B.USE,
    B.SELECT_WEAPON1, B.SELECT_WEAPON2, B.SELECT_WEAPON3, B.SELECT_WEAPON4, B.SELECT_WEAPON5,
    B.SELECT_WEAPON6, B.SELECT_WEAPON7, B.TURN_LEFT_RIGHT_DELTA,
]
# Aim: the 21 values -12.5..12.5 in 1.25 steps (Table A.4), zero moved to index 0 ("no-action").
_AIM = [0.0] + [1.25 * k for k in range(-10, 0)] + [1.25 * k for k in range(1, 11)]

# (GameVariable, divisor): what a human sees on the HUD (paper A.3), scaled to about [0, 1].
MEASUREMENTS: list[tuple[vzd.GameVariable, float]] = [
    (V.HEALTH, 100.0), (V.ARMOR, 100.0), (V.SELECTED_WEAPON, 7.0),
    (V.SELECTED_WEAPON_AMMO, 50.0), (V.FRAGCOUNT, 10.0), (V.PLAYER_COUNT, 8.0),
    *[(getattr(V, f"WEAPON{i}"), 1.0) for i in range(1, 8)],
    # Ammo per weapon slot over its usual maximum: bullets 200, shells 50, rockets 50, cells 300.
    *[(getattr(V, f"AMMO{i}"), m)
      for i, m in zip(range(2, 8), (200, 50, 200, 50, 300, 300), strict=True)],
]

# Reward shaping: key -> game variable whose per-step change is multiplied by the coefficient.
# health/armor/ammo/weapon count only increases (pickups); frag/death/damage count every change.
SHAPING_VARS: dict[str, list[vzd.GameVariable]] = {
    "frag": [V.FRAGCOUNT],
    "death": [V.DEATHCOUNT],
    "damage": [V.DAMAGECOUNT],
    "health": [V.HEALTH],
    "armor": [V.ARMOR],
    "ammo": [getattr(V, f"AMMO{i}") for i in range(2, 8)],
    "weapon": [getattr(V, f"WEAPON{i}") for i in range(2, 8)],
}
_PICKUP_ONLY = frozenset({"health", "armor", "ammo", "weapon"})

# Defaults for bot deathmatch, close to Sample Factory's: +1 per frag, a death costs most of a
# frag, small bonuses so early exploration finds items. Doom's own deathmatch reward is 0.
DEATHMATCH_SHAPING: dict[str, float] = {
    "frag": 1.0, "death": -0.75, "damage": 0.003, "health": 0.005, "armor": 0.005,
    "ammo": 0.0005, "weapon": 0.1,
}


def shaping_variables() -> list[vzd.GameVariable]:
    """Every game variable any shaping key reads, deduplicated, in a fixed order."""
    return list(dict.fromkeys(v for vs in SHAPING_VARS.values() for v in vs))


def shaping_reward(coefs: dict[str, float], prev: dict[vzd.GameVariable, float],
                   cur: dict[vzd.GameVariable, float]) -> float:
    """Sum of coef * change of each shaping key's variables between two readings."""
    total = 0.0
    for key, coef in coefs.items():
        if not coef:
            continue
        for var in SHAPING_VARS[key]:
            delta = cur[var] - prev[var]
            if key in _PICKUP_ONLY and delta < 0:
                continue
            total += coef * delta
    return total


def check_shaping_keys(coefs: dict[str, float]) -> None:
    """Raise ValueError naming unknown reward-shaping keys."""
    unknown = sorted(set(coefs) - set(SHAPING_VARS))
    if unknown:
        raise ValueError(f"unknown reward_shaping keys {unknown}; known: {sorted(SHAPING_VARS)}")


def simple_actions(buttons: list[vzd.Button]) -> list[list[float]]:
    """Button vectors of the `simple` space: no-op, then each binary button alone."""
    n = len(buttons)
    table = [[0.0] * n]
    for i, b in enumerate(buttons):
        if not vzd.is_delta_button(b):
            table.append([1.0 if j == i else 0.0 for j in range(n)])
    return table


def full_action_table() -> list[list[tuple[int, float] | None]]:
    """Per head, per index: the (button index, value) it sets in FULL_BUTTONS, or None."""
    idx = {b: i for i, b in enumerate(FULL_BUTTONS)}
    weapons = [idx[getattr(B, f"SELECT_WEAPON{k}")] for k in range(1, 8)]
    turn = idx[B.TURN_LEFT_RIGHT_DELTA]
    return [
        [None, (idx[B.MOVE_FORWARD], 1.0), (idx[B.MOVE_BACKWARD], 1.0)],
        [None, (idx[B.MOVE_LEFT], 1.0), (idx[B.MOVE_RIGHT], 1.0)],
        [None, (idx[B.ATTACK], 1.0)],
        [None, (idx[B.SPEED], 1.0)],
        [None, (idx[B.USE], 1.0)],
        [None, *[(w, 1.0) for w in weapons]],
        [None, *[(turn, a) for a in _AIM[1:]]],
    ]
