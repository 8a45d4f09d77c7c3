"""VizDoom scenario names -> files, game mode, and how Sample Factory trains each one.

Three sources of scenarios:

- every `.cfg` in `vizdoom.scenarios_path` is a scenario under its file name;
- Sample Factory's own scenarios (`battle`, `battle2`, `benchmark`, `two_colors_easy`/`_hard`,
  `deathmatch_bots`, `duel_bots`), whose `.cfg`/`.wad` files sfbus does not ship: they are read
  from an installed `sample-factory` package (`pip install --no-deps sample-factory==2.1.1`; the
  files need none of its dependencies) or from the folder the env's `scenarios_dir` names;
- any `.cfg` by path (`doom:/path/to/my.cfg`), with the `.wad` it names beside it.

The table gives what Sample Factory 2.x's `DOOM_ENVS` gives the scenarios it trains
(sf_examples/vizdoom/doom/doom_utils.py), so that `doom_<name>` learns here as it does there:

- its action heads (see `spaces`); without heads, the `simple` space, one head over the cfg's
  buttons, Sample Factory's `Discrete(1 + n)`;
- its measurements beside the image (`SF_MEASUREMENTS`, its `DoomAdditionalInput`) and its reward
  shaping (`spaces.DEATHMATCH_SHAPING`, `BATTLE_SHAPING`), the game's own score kept as the true
  objective (frags in deathmatch);
- its reward scale (basic and deadly_corridor: 0.01), applied by the learner before its own
  `reward_scale`, so the reported episode return stays the game's;
- the gathering reward shaping of arXiv 1904.01806 (health_gathering*, two_colors*): +1 for every
  step whose health rose;
- its matches against ZDoom's bots: how many, the respawn delay, four-minute episodes;
- where Sample Factory ships its own `.cfg` for one of VizDoom's scenarios, what that cfg changes
  against VizDoom's: the gathering scenarios reward 0.01 per tic alive with no death penalty
  (VizDoom's 1 per tic and -100 drown the +1 shaping; Sample Factory's true objective is then
  seconds alive / 3.5) and add MOVE_BACKWARD; basic and the defend/corridor scenarios show the
  HUD. Sample Factory turns decals and particles off everywhere; `game.py` does too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import vizdoom as vzd

from sfbus_components.envs.doom import spaces as ds

B = vzd.Button
SAMPLE_FACTORY = "sample-factory==2.1.1"
_SF_FOLDER = "sf_examples/vizdoom/doom/scenarios"  # inside the installed package


@dataclass(frozen=True)
class Scenario:
    """How a scenario name maps onto VizDoom files and game mode, and how it is trained."""

    cfg: str
    wad: str | None = None
    doom_map: str | None = None
    sample_factory: bool = False
    """Its files are Sample Factory's (see the module's docstring for where they are found)."""
    deathmatch: bool = False
    """Hosted deathmatch: bots allowed, death respawns instead of ending the episode, frags are
    the true objective."""
    num_bots: int = 0
    respawn_delay: int = 0
    """Seconds a dead player waits before it respawns (deathmatch)."""
    episode_timeout: int | None = None
    """Tics; None: the cfg's."""
    heads: tuple[ds.Head, ...] | None = None
    """Sample Factory's action heads; None: the `simple` space over the cfg's own buttons."""
    measurements: list[ds.Measurement] | None = None
    """The measurements on by default; None: none unless asked for."""
    reward_shaping: dict[str, float] | None = None
    """Default shaping coefficients (`spaces.SHAPING_TERMS`); None: none."""
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
MOVE = (B.MOVE_FORWARD, B.MOVE_BACKWARD)
GATHERING = {"gathering": True, "living_reward": 0.01, "death_penalty": 0.0, "weapon": False,
             "buttons": (*TURN, B.MOVE_FORWARD, B.MOVE_BACKWARD)}
# Sample Factory's doom_action_space_discretized_no_weap: move, strafe, attack, sprint, and
# turning by -10..10 degrees in 11 steps.
BATTLE_HEADS: tuple[ds.Head, ...] = (
    MOVE, (B.MOVE_RIGHT, B.MOVE_LEFT), (B.ATTACK,), (B.SPEED,),
    ds.DeltaHead.evenly(B.TURN_LEFT_RIGHT_DELTA, 11, -10.0, 10.0))


def bots_heads(use: bool) -> tuple[ds.Head, ...]:
    """Sample Factory's doom_action_space_full_discretized: move, strafe, weapon 1-7, attack,
    sprint, (use,) and turning by -12.5..12.5 degrees in 21 steps."""
    weapons = tuple(getattr(B, f"SELECT_WEAPON{k}") for k in range(1, 8))
    return (MOVE, (B.MOVE_RIGHT, B.MOVE_LEFT), weapons, (B.ATTACK,), (B.SPEED,),
            *([(B.USE,)] if use else []),
            ds.DeltaHead.evenly(B.TURN_LEFT_RIGHT_DELTA, 21, -12.5, 12.5))


_BATTLE = {"sample_factory": True, "heads": BATTLE_HEADS, "measurements": ds.SF_MEASUREMENTS,
           "reward_shaping": ds.BATTLE_SHAPING}
# Against bots: four-minute matches (Sample Factory's timelimit 4.0), frags the true objective.
_BOTS = {"sample_factory": True, "deathmatch": True, "episode_timeout": 4 * 60 * 35,
         "measurements": ds.SF_MEASUREMENTS, "reward_shaping": ds.DEATHMATCH_SHAPING}
SCENARIOS: dict[str, Scenario] = {
    "basic": Scenario("basic.cfg", reward_scale=0.01, hud=True),
    "deadly_corridor": Scenario("deadly_corridor.cfg", reward_scale=0.01, hud=True, heads=(
        TURN, MOVE, (B.MOVE_LEFT, B.MOVE_RIGHT), (B.ATTACK,))),
    "defend_the_center": Scenario("defend_the_center.cfg", hud=True, heads=(TURN, (B.ATTACK,))),
    "defend_the_line": Scenario("defend_the_line.cfg", hud=True, heads=(TURN, (B.ATTACK,))),
    "my_way_home": Scenario("my_way_home.cfg", heads=(TURN, MOVE)),
    "health_gathering": Scenario("health_gathering.cfg", **GATHERING),
    "health_gathering_supreme": Scenario("health_gathering_supreme.cfg", **GATHERING),
    "deathmatch": Scenario("deathmatch.cfg", wad="cig.wad", doom_map="map01", deathmatch=True,
                           num_bots=7,  # 7 bots fill the CIG map (its 8 player starts)
                           reward_shaping=ds.DEATHMATCH_SHAPING),
    "deathmatch_monsters": Scenario("deathmatch.cfg"),
    "cig": Scenario("cig.cfg", deathmatch=True, reward_shaping=ds.DEATHMATCH_SHAPING),
    # Sample Factory's own scenarios (their files come from its package)
    "battle": Scenario("battle_continuous_turning.cfg", **_BATTLE),
    "battle2": Scenario("battle2_continuous_turning.cfg", **_BATTLE),
    # the throughput scenario: Battle's map, its 8 buttons as one head, nothing else
    "benchmark": Scenario("battle.cfg", sample_factory=True),
    "two_colors_easy": Scenario("two_colors_easy.cfg", sample_factory=True, heads=(TURN, MOVE),
                                gathering=True),
    "two_colors_hard": Scenario("two_colors_hard.cfg", sample_factory=True, heads=(TURN, MOVE),
                                gathering=True),
    "deathmatch_bots": Scenario("dwango5_dm_continuous_weap.cfg", num_bots=7,
                                heads=bots_heads(use=False), **_BOTS),
    "duel_bots": Scenario("ssl2.cfg", num_bots=1, respawn_delay=2, heads=bots_heads(use=True),
                          **_BOTS),
}


def doom_scenarios() -> list[str]:
    """Every scenario name accepted by `make_doom_env`, sorted."""
    names = {f[:-4] for f in os.listdir(vzd.scenarios_path) if f.endswith(".cfg")}
    return sorted(names | set(SCENARIOS))


def scenario(name: str) -> Scenario:
    """The scenario called `name` (a table entry, a `.cfg` of VizDoom's, or a `.cfg` path)."""
    if name in SCENARIOS:
        return SCENARIOS[name]
    if name.endswith(".cfg"):
        return Scenario(os.path.abspath(name))
    if name not in doom_scenarios():
        raise ValueError(f"unknown VizDoom scenario {name!r}; known: {doom_scenarios()}")
    return Scenario(f"{name}.cfg")


def sample_factory_folder() -> Path | None:
    """The scenarios folder of an installed `sample-factory` package, or None."""
    try:
        folder = Path(str(distribution("sample-factory").locate_file(_SF_FOLDER)))
    except PackageNotFoundError:
        return None
    return folder if folder.is_dir() else None


def scenario_files(name: str, sc: Scenario, scenarios_dir: str | None = None,
                   ) -> tuple[str, str | None]:
    """The `.cfg` path of scenario `name` and the `.wad` path set beside it (None: the cfg's
    own); raise ValueError saying how to get files that are missing."""
    if not sc.sample_factory:
        folder = Path(vzd.scenarios_path)
        cfg = folder / sc.cfg  # an absolute path (a user's cfg) stays what it is
        if not cfg.is_file():
            raise ValueError(f"VizDoom scenario file {cfg} does not exist")
        _check_cfg_wad(cfg, name)
        return str(cfg), None if sc.wad is None else str(folder / sc.wad)
    found = Path(scenarios_dir).expanduser() if scenarios_dir else sample_factory_folder()
    cfg = None if found is None else found / sc.cfg
    if cfg is None or not cfg.is_file():
        where = (f"the folder scenarios_dir names ({found}) holds no {sc.cfg}" if scenarios_dir
                 else "no sample-factory package is installed")
        raise ValueError(
            f"VizDoom scenario {name!r} is Sample Factory's and sfbus does not ship its files: "
            f"{where}; install them with `pip install --no-deps {SAMPLE_FACTORY}` (the files "
            "need none of its dependencies), or set the env's scenarios_dir to a folder holding "
            f"{sc.cfg} and its .wad")
    _check_cfg_wad(cfg, name)
    return str(cfg), None


def _check_cfg_wad(cfg: Path, name: str) -> None:
    """Raise ValueError when the `.wad` a cfg names (relative to the cfg) is missing."""
    match = re.search(r"^\s*doom_scenario_path\s*=\s*(\S+)", cfg.read_text(errors="replace"),
                      re.MULTILINE)
    if match and not (cfg.parent / match.group(1)).is_file():
        raise ValueError(f"VizDoom scenario {name!r}: {cfg} names doom_scenario_path "
                         f"{match.group(1)}, which is not in {cfg.parent}")
