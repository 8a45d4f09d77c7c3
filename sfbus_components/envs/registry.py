"""Env names -> factories: `doom_<scenario>`, `doom:<path.cfg>`, `atari_<game>`, `mujoco_<name>`,
`gym:<EnvId>`, `envpool:<TaskId>`, short names, `pkg.mod:factory`.

Short names come from `register_env` and from the `sfbus.envs` entry points of installed
packages. A registration reaches every process the registering one starts: its factory's import
path travels in the `SFBUS_ENVS` environment variable, which child processes inherit.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from sfbus import ImportPathError, import_object
from sfbus_components.envs.checks import EnvSpecError, adapt, check_env, import_path
from sfbus_components.envs.spec import EnvSpec, MultiAgentEnv
from sfbus_components.envs.vector import BatchedEnv

Factory = Callable[..., Any]
"""Returns a `MultiAgentEnv` or a `gymnasium.Env` (adapted as `gym:<id>` envs are)."""

# Short names of built-in envs, as import strings so nothing heavy loads until used.
_REGISTRY: dict[str, Factory | str] = {
    "toy_multi_agent": "sfbus_components.envs.multi_agent:make_toy_env",
    "doom_duel": "sfbus_components.envs.doom.duel:make_doom_duel",
}
_SPEC_CACHE: dict[tuple[str, str], EnvSpec] = {}
CARRIED_ENVS = "SFBUS_ENVS"
"""Environment variable: JSON of the names registered in a launching process -> import paths."""
ENTRY_POINT_GROUP = "sfbus.envs"
# Names registered here with a factory that no other process can import (a lambda, a function
# of __main__), with what it is: refused where a run would need it in its other processes.
_LOCAL_ONLY: dict[str, str] = {}


class UnknownEnvError(ValueError):
    """The caller named an env that no factory provides; the message lists close names."""


def register_env(name: str, factory: Factory | str) -> None:
    """Make `name` create envs with `factory` (a callable or a `pkg.mod:function` string), here
    and in every process this one starts afterwards (a run's processes import it by path)."""
    _REGISTRY[name] = factory
    path = factory if isinstance(factory, str) else import_path(factory)
    carried = _carried()
    if path is None:
        _LOCAL_ONLY[name] = (f"{getattr(factory, '__module__', '?')}."
                             f"{getattr(factory, '__qualname__', repr(factory))}")
        carried.pop(name, None)
    else:
        _LOCAL_ONLY.pop(name, None)
        carried[name] = path
    os.environ[CARRIED_ENVS] = json.dumps(carried)


def make_env(name: str, **kwargs: Any) -> MultiAgentEnv:
    """Create the env called `name`, passing `kwargs` to its factory; a `gymnasium.Env` it
    returns is adapted as `gym:<id>` envs are."""
    return adapt(_resolve(name)(**kwargs), name)


def make_batched_env(name: str, count: int, **kwargs: Any) -> BatchedEnv | None:
    """``count`` envs `name` stepped by one call where its factory has a native batch (a
    `batched` method, as EnvPool's), else None (the caller steps envs one by one)."""
    batched = getattr(_resolve(name), "batched", None)
    return None if batched is None else batched(count, **kwargs)


def env_spec(name: str, **kwargs: Any) -> EnvSpec:
    """The spec of env `name` built with `kwargs`, checked against what one real reset and step
    return (creates and closes one env; cached). Raises `EnvSpecError` for an env that does not
    match its declared spaces, or that a run's other processes could not create."""
    if name in _LOCAL_ONLY:
        raise EnvSpecError(
            f"env {name!r} is registered with {_LOCAL_ONLY[name]}, which the run's other "
            "processes cannot import (a lambda, a local function or one of __main__): define "
            "the factory at the top level of a module of its own and register it from there")
    key = (name, repr(sorted((k, v) for k, v in kwargs.items() if k != "seed")))
    if key not in _SPEC_CACHE:
        try:
            env = make_env(name, **kwargs)
        except ValueError:  # says what is wrong already (an unknown name, a refused setting)
            raise
        except Exception as error:  # the user's factory failed: say which env it was
            raise EnvSpecError(f"env {name!r}: creating it raised {type(error).__name__}: "
                               f"{error}") from error
        try:
            _SPEC_CACHE[key] = check_env(env, name)
        finally:
            env.close()
    return _SPEC_CACHE[key]


def known_envs() -> list[str]:
    """Registered short names (`register_env`, `sfbus.envs` entry points), every
    `doom_<scenario>`, `atari_<game>` and `mujoco_<name>`, sorted (`gym:<Id>` not listed)."""
    from sfbus_components.envs.mujoco import MUJOCO_ENVS

    return sorted(set(_REGISTRY) | set(_carried()) | set(_entry_points()) | set(_doom_names())
                  | set(_atari_names()) | set(MUJOCO_ENVS))


def _resolve(name: str) -> Factory:
    registered = _registered(name)
    if registered is not None:
        return registered
    if name.startswith("doom_"):
        from sfbus_components.envs.doom.game import make_doom_env
        from sfbus_components.envs.doom.scenarios import doom_scenarios

        scenario = name[len("doom_"):]
        if scenario not in doom_scenarios():
            raise UnknownEnvError(_unknown(name, _doom_names()))
        return lambda **kw: make_doom_env(scenario, **kw)
    if name.startswith("doom:"):  # a user's own scenario: its .cfg, the .wad it names beside it
        from sfbus_components.envs.doom.game import make_doom_env

        cfg = name[len("doom:"):]
        if not cfg.endswith(".cfg"):
            raise UnknownEnvError(f"env {name!r}: name a VizDoom .cfg file after 'doom:'")
        return lambda **kw: make_doom_env(cfg, **kw)
    if name.startswith("atari_"):
        try:
            from sfbus_components.envs.atari import atari_games, atari_names, make_atari_env
        except ImportError as e:
            raise UnknownEnvError(f"env {name!r} needs ale-py ({e}); pip install ale-py") from e
        game = name[len("atari_"):]
        if game not in atari_games():  # unknown game, or its ROM is missing from ale-py
            raise UnknownEnvError(_unknown(name, atari_names()))
        return lambda **kw: make_atari_env(game, **kw)
    if name.startswith("mujoco_"):
        from sfbus_components.envs.mujoco import MUJOCO_ENVS, make_mujoco_env

        if name not in MUJOCO_ENVS:
            raise UnknownEnvError(_unknown(name, sorted(MUJOCO_ENVS)))
        return lambda **kw: make_mujoco_env(name, **kw)
    if name.startswith("envpool:"):
        try:
            from sfbus_components.envs.envpool_env import EnvPoolFactory, envpool_tasks
        except ImportError as e:
            raise UnknownEnvError(f"env {name!r} needs envpool ({e}); pip install envpool") from e
        task = name[len("envpool:"):]
        if task not in envpool_tasks():
            raise UnknownEnvError(_unknown(name, [f"envpool:{t}" for t in envpool_tasks()]))
        return EnvPoolFactory(task)
    if name.startswith("gym:"):
        import gymnasium as gym

        from sfbus_components.envs.gym_adapter import make_gym_env

        env_id = name[len("gym:"):]
        if env_id not in gym.envs.registry:
            raise UnknownEnvError(_unknown(name, [f"gym:{k}" for k in gym.envs.registry]))
        return lambda **kw: make_gym_env(env_id, **kw)
    if name.startswith("pettingzoo:"):
        from sfbus_components.envs.pettingzoo_adapter import pettingzoo_factory

        return pettingzoo_factory(name[len("pettingzoo:"):])
    if ":" in name:
        return _import(name, name)
    raise UnknownEnvError(_unknown(name, known_envs()))


def _registered(name: str) -> Factory | None:
    """The factory registered as `name` here, by the process that started this one, or by an
    installed package's `sfbus.envs` entry point (in that order), or None."""
    factory = _REGISTRY.get(name) or _carried().get(name)
    if factory is not None:
        return _import(factory, name) if isinstance(factory, str) else factory
    entry = _entry_points().get(name)
    if entry is None:
        return None
    try:
        return entry.load()
    except (ImportError, AttributeError) as e:
        raise UnknownEnvError(f"env {name!r}: its entry point {entry.value!r} (group "
                              f"{ENTRY_POINT_GROUP}) cannot be loaded: {e}") from e


@functools.cache  # the installed packages do not change under a running process
def _entry_points() -> dict[str, EntryPoint]:
    return {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def _carried() -> dict[str, str]:
    """Names registered by the process that started this one (or by this one), by import path."""
    text = os.environ.get(CARRIED_ENVS)
    try:
        carried = json.loads(text) if text else {}
    except json.JSONDecodeError:
        carried = None
    if not isinstance(carried, dict):
        raise UnknownEnvError(f"environment variable {CARRIED_ENVS} is not a JSON object of "
                              f"env names -> 'module:factory' paths: {text!r}")
    return carried


def _import(target: str, name: str) -> Factory:
    """The env factory ``package.module:name`` (or ``:Outer.make``) for env ``name``."""
    try:
        factory = import_object(target)
    except ImportPathError as error:
        raise UnknownEnvError(f"env {name!r}: {error}") from None
    if not callable(factory):
        raise UnknownEnvError(f"env {name!r}: {target!r} is not callable (its type is "
                              f"{type(factory).__name__}), so not an env factory")
    return factory


def _doom_names() -> list[str]:
    try:
        from sfbus_components.envs.doom.scenarios import doom_scenarios
    except ImportError:  # vizdoom or cv2 missing: no doom envs to offer
        return []
    return [f"doom_{s}" for s in doom_scenarios()]


def _atari_names() -> list[str]:
    try:
        from sfbus_components.envs.atari import atari_names
    except ImportError:  # ale-py missing: no Atari envs to offer
        return []
    return atari_names()


def _unknown(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    # The 100-odd Atari games would drown the other names: they are named by their pattern.
    listed = [c for c in candidates if not c.startswith("atari_")] or candidates
    listed = listed if len(listed) <= 80 else [*close, "..."]
    return (f"unknown env {name!r}{hint} Known: {', '.join(listed)}; also 'atari_<game>' for "
            "the Atari games of ale-py, 'doom:<path.cfg>' for a VizDoom scenario of your own, "
            "'gym:<EnvId>' for any gymnasium id, "
            "'pettingzoo:<module>' for a PettingZoo parallel env, 'envpool:<TaskId>' for "
            "EnvPool's tasks and "
            "'pkg.module:factory' for your own.")
