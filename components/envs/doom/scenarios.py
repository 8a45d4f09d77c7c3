"""VizDoom scenario names -> files, game mode, and how Sample Factory trains each one.

Every `.cfg` in `vizdoom.scenarios_path` is a scenario under its file name. The table adds what
Sample Factory 2.x's `DOOM_ENVS` gives the scenarios it trains (sf_examples/vizdoom/doom/
doom_utils.py), so that `doom_<name>` learns here as it does there:

- its action space: button groups, each one categorical head whose index 0 is the no-op
  (defend_the_center: turn left/right x attack); the other scenarios use the `simple` space,
  one head over the cfg's buttons, Sample Factory's `Discrete(1 + n)`;
- its reward scale (basic and deadly_corridor: 0.01), applied by the learner before its own
  `reward_scale`, so the reported episode return stays the game's;
- the gathering reward shaping of arXiv 1904.01806 (health_gathering*): +1 for every step whose
  health rose, the game's own reward kept as the true objective;
- where Sample Factory ships its own `.cfg` for a scenario, what that cfg changes against
  VizDoom's: the gathering scenarios reward 0.01 per tic alive with no death penalty (VizDoom's
  1 per tic and -100 drown the +1 shaping; Sample Factory's true objective is then seconds alive
  / 3.5) and add MOVE_BACKWARD; basic and the defend/corridor scenarios show the HUD. Sample
  Factory turns decals and particles off everywhere; `game.py` does too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import vizdoom as vzd

B = vzd.Button


@dataclass(frozen=True)
class Scenario:
    """How a scenario name maps onto VizDoom files and game mode, and how it is trained."""

    cfg: str
    wad: str | None = None
    doom_map: str | None = None
    deathmatch: bool = False
    """Hosted deathmatch: bots allowed, death respawns instead of ending the episode."""
    num_bots: int = 0
    action_groups: tuple[tuple[vzd.Button, ...], ...] | None = None
    """Sample Factory's heads: the buttons each head presses at index 1, 2, ...; None: the
    `simple` space over the cfg's own buttons."""
    reward_scale: float = 1.0
    """Factor on the game's reward before training (Sample Factory's `reward_scaling`)."""
    gathering: bool = False
    """+1 reward for every step in which health rose (the gathering scenarios' shaping)."""
    living_reward: float | None = None
    """Game reward per tic alive; None: the cfg's."""
    death_penalty: float | None = None
    """Game reward lost on death; None: the cfg's."""
    buttons: tuple[vzd.Button, ...] | None = None
    """The `simple` space's buttons; None: the cfg's."""
    hud: bool | None = None
    """Render the status bar into the observation; None: the cfg's."""
    weapon: bool | None = None
    """Render the player's weapon; None: the cfg's."""


TURN = (B.TURN_LEFT, B.TURN_RIGHT)
GATHERING = {"gathering": True, "living_reward": 0.01, "death_penalty": 0.0, "weapon": False,
             "buttons": (*TURN, B.MOVE_FORWARD, B.MOVE_BACKWARD)}
SCENARIOS: dict[str, Scenario] = {
    "basic": Scenario("basic.cfg", reward_scale=0.01, hud=True),
    "deadly_corridor": Scenario("deadly_corridor.cfg", reward_scale=0.01, hud=True, action_groups=(
        TURN, (B.MOVE_FORWARD, B.MOVE_BACKWARD), (B.MOVE_LEFT, B.MOVE_RIGHT), (B.ATTACK,))),
    "defend_the_center": Scenario("defend_the_center.cfg", hud=True,
                                  action_groups=(TURN, (B.ATTACK,))),
    "defend_the_line": Scenario("defend_the_line.cfg", hud=True,
                                action_groups=(TURN, (B.ATTACK,))),
    "my_way_home": Scenario("my_way_home.cfg",
                            action_groups=(TURN, (B.MOVE_FORWARD, B.MOVE_BACKWARD))),
    "health_gathering": Scenario("health_gathering.cfg", **GATHERING),
    "health_gathering_supreme": Scenario("health_gathering_supreme.cfg", **GATHERING),
    "deathmatch": Scenario("deathmatch.cfg", wad="cig.wad", doom_map="map01", deathmatch=True,
                           num_bots=7),  # 7 bots fill the CIG map (its 8 player starts)
    "deathmatch_monsters": Scenario("deathmatch.cfg"),
    "cig": Scenario("cig.cfg", deathmatch=True),
}


def doom_scenarios() -> list[str]:
    """Every scenario name accepted by `make_doom_env`, sorted."""
    names = {f[:-4] for f in os.listdir(vzd.scenarios_path) if f.endswith(".cfg")}
    return sorted(names | set(SCENARIOS))


def scenario(name: str) -> Scenario:
    """The scenario called `name` (a table entry, or a plain `.cfg` of VizDoom's)."""
    if name in SCENARIOS:
        return SCENARIOS[name]
    if name not in doom_scenarios():
        raise ValueError(f"unknown VizDoom scenario {name!r}; known: {doom_scenarios()}")
    return Scenario(f"{name}.cfg")


def group_actions(groups: tuple[tuple[vzd.Button, ...], ...],
                  ) -> list[list[tuple[int, float] | None]]:
    """Per head, per index: the (button index, value) it presses among the concatenated groups,
    None for the no-op at index 0 (the layout of `spaces.full_action_table`)."""
    tables: list[list[tuple[int, float] | None]] = []
    offset = 0
    for group in groups:
        tables.append([None, *[(offset + i, 1.0) for i in range(len(group))]])
        offset += len(group)
    return tables
