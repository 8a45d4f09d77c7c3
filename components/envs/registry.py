"""Env names -> factories: `doom_<scenario>`, `atari_<game>`, `mujoco_<name>`, `gym:<EnvId>`,
short names, `pkg.mod:factory`."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from components.envs.spec import EnvSpec, MultiAgentEnv

Factory = Callable[..., MultiAgentEnv]

# Short names of built-in envs, as import strings so nothing heavy loads until used.
_REGISTRY: dict[str, Factory | str] = {
    "toy_multi_agent": "components.envs.multi_agent:make_toy_env",
    "doom_duel": "components.envs.doom.duel:make_doom_duel",
    "doom_duel_bots": "components.envs.doom.duel:make_doom_duel_bots",
}
_SPEC_CACHE: dict[tuple[str, str], EnvSpec] = {}


class UnknownEnvError(ValueError):
    """The caller named an env that no factory provides; the message lists close names."""


def register_env(name: str, factory: Factory | str) -> None:
    """Make `name` create envs with `factory` (a callable or a `pkg.mod:function` string)."""
    _REGISTRY[name] = factory


def make_env(name: str, **kwargs: Any) -> MultiAgentEnv:
    """Create the env called `name`, passing `kwargs` to its factory."""
    return _resolve(name)(**kwargs)


def env_spec(name: str, **kwargs: Any) -> EnvSpec:
    """The spec of env `name` built with `kwargs` (creates and closes one env; cached)."""
    key = (name, repr(sorted((k, v) for k, v in kwargs.items() if k != "seed")))
    if key not in _SPEC_CACHE:
        env = make_env(name, **kwargs)
        try:
            _SPEC_CACHE[key] = env.spec
        finally:
            env.close()
    return _SPEC_CACHE[key]


def known_envs() -> list[str]:
    """Registered short names, every `doom_<scenario>`, `atari_<game>` and `mujoco_<name>`,
    sorted (`gym:<Id>` not listed)."""
    from components.envs.mujoco import MUJOCO_ENVS

    return sorted(set(_REGISTRY) | set(_doom_names()) | set(_atari_names()) | set(MUJOCO_ENVS))


def _resolve(name: str) -> Factory:
    if name in _REGISTRY:
        factory = _REGISTRY[name]
        return _import(factory, name) if isinstance(factory, str) else factory
    if name.startswith("doom_"):
        from components.envs.doom.game import make_doom_env
        from components.envs.doom.scenarios import doom_scenarios

        scenario = name[len("doom_"):]
        if scenario not in doom_scenarios():
            raise UnknownEnvError(_unknown(name, _doom_names()))
        return lambda **kw: make_doom_env(scenario, **kw)
    if name.startswith("atari_"):
        try:
            from components.envs.atari import atari_games, atari_names, make_atari_env
        except ImportError as e:
            raise UnknownEnvError(f"env {name!r} needs ale-py ({e}); pip install ale-py") from e
        game = name[len("atari_"):]
        if game not in atari_games():  # unknown game, or its ROM is missing from ale-py
            raise UnknownEnvError(_unknown(name, atari_names()))
        return lambda **kw: make_atari_env(game, **kw)
    if name.startswith("mujoco_"):
        from components.envs.mujoco import MUJOCO_ENVS, make_mujoco_env

        if name not in MUJOCO_ENVS:
            raise UnknownEnvError(_unknown(name, sorted(MUJOCO_ENVS)))
        return lambda **kw: make_mujoco_env(name, **kw)
    if name.startswith("gym:"):
        import gymnasium as gym

        from components.envs.gym_adapter import make_gym_env

        env_id = name[len("gym:"):]
        if env_id not in gym.envs.registry:
            raise UnknownEnvError(_unknown(name, [f"gym:{k}" for k in gym.envs.registry]))
        return lambda **kw: make_gym_env(env_id, **kw)
    if ":" in name:
        return _import(name, name)
    raise UnknownEnvError(_unknown(name, known_envs()))


def _import(target: str, name: str) -> Factory:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownEnvError(f"env {name!r}: cannot import module {module_name!r}: {e}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UnknownEnvError(f"env {name!r}: module {module_name!r} has no callable {attr!r}")
    return factory


def _doom_names() -> list[str]:
    try:
        from components.envs.doom.scenarios import doom_scenarios
    except ImportError:  # vizdoom or cv2 missing: no doom envs to offer
        return []
    return [f"doom_{s}" for s in doom_scenarios()]


def _atari_names() -> list[str]:
    try:
        from components.envs.atari import atari_names
    except ImportError:  # ale-py missing: no Atari envs to offer
        return []
    return atari_names()


def _unknown(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    # The 100-odd Atari games would drown the other names: they are named by their pattern.
    listed = [c for c in candidates if not c.startswith("atari_")] or candidates
    listed = listed if len(listed) <= 40 else [*close, "..."]
    return (f"unknown env {name!r}{hint} Known: {', '.join(listed)}; also 'atari_<game>' for "
            "the Atari games of ale-py, 'gym:<EnvId>' for any gymnasium id and "
            "'pkg.module:factory' for your own.")
