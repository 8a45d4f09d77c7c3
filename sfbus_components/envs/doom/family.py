"""The `doom_<scenario>` and `doom:<path.cfg>` env names (the registry's `doom_` and `doom:`
families)."""

from __future__ import annotations

from collections.abc import Callable

from sfbus_components.envs.doom.game import DoomEnv, make_doom_env
from sfbus_components.envs.doom.scenarios import doom_scenarios
from sfbus_components.envs.family import UnknownEnvError, unknown_env


def doom_names() -> list[str]:
    """`doom_<scenario>` for every scenario VizDoom and Sample Factory ship."""
    return [f"doom_{s}" for s in doom_scenarios()]


def resolve_scenario(name: str) -> Callable[..., DoomEnv]:
    """The factory of `doom_<scenario>`, one of `doom_names`."""
    scenario = name[len("doom_"):]
    if scenario not in doom_scenarios():
        raise unknown_env(name, doom_names())
    return lambda **kwargs: make_doom_env(scenario, **kwargs)


def resolve_cfg(name: str) -> Callable[..., DoomEnv]:
    """The factory of `doom:<path.cfg>`, a user's own scenario: its .cfg, the .wad it names
    beside it."""
    cfg = name[len("doom:"):]
    if not cfg.endswith(".cfg"):
        raise UnknownEnvError(f"env {name!r}: name a VizDoom .cfg file after 'doom:'")
    return lambda **kwargs: make_doom_env(cfg, **kwargs)
