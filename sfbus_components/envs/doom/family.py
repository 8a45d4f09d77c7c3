"""The `doom_<scenario>` and `doom:<path.cfg>` env names (the registry's `doom_` and `doom:`
families)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sfbus_components.envs.doom.duel import make_doom_duel
from sfbus_components.envs.doom.game import make_doom_env
from sfbus_components.envs.doom.scenarios import doom_scenarios
from sfbus_components.envs.family import UnknownEnvError, unknown_env

DUEL = "doom_duel"
"""Agents against each other in one game (`duel.py`), beside the one-agent scenarios."""


def doom_names() -> list[str]:
    """`doom_<scenario>` for every scenario VizDoom and Sample Factory ship, and `doom_duel`."""
    return [DUEL, *(f"doom_{s}" for s in doom_scenarios())]


def resolve_scenario(name: str) -> Callable[..., Any]:
    """The factory of `doom_<scenario>` or `doom_duel`, one of `doom_names`."""
    if name == DUEL:
        return make_doom_duel
    scenario = name[len("doom_"):]
    if scenario not in doom_scenarios():
        raise unknown_env(name, doom_names())
    return lambda **kwargs: make_doom_env(scenario, **kwargs)


def resolve_cfg(name: str) -> Callable[..., Any]:
    """The factory of `doom:<path.cfg>`, a user's own scenario: its .cfg, the .wad it names
    beside it."""
    cfg = name[len("doom:"):]
    if not cfg.endswith(".cfg"):
        raise UnknownEnvError(f"env {name!r}: name a VizDoom .cfg file after 'doom:'")
    return lambda **kwargs: make_doom_env(cfg, **kwargs)
