"""Env names -> factories: registered short names, then the families by prefix (`doom_<scenario>`,
`doom:<path.cfg>`, `atari_<game>`, `mujoco_<name>`, `gym:<EnvId>`, `envpool:<TaskId>`,
`pettingzoo:<id>`, a user's own), then an import path `pkg.mod:factory`.

Short names come from `register_env` and from the `sfbus.envs` entry points of installed
packages; families from :data:`FAMILIES`, `register_env_family` and the `sfbus.env_families`
entry points. A registration reaches every process the registering one starts: its import paths
travel in the `SFBUS_ENVS` / `SFBUS_ENV_FAMILIES` environment variables, which child processes
inherit.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from sfbus import ImportPathError, import_object
from sfbus_components.envs.checks import EnvSpecError, adapt, check_env, import_path
from sfbus_components.envs.family import (
    EnvFamily,
    UnknownEnvError,
    unknown_env,
)
from sfbus_components.envs.spec import EnvSpec, MultiAgentEnv
from sfbus_components.envs.vector import BatchedEnv

Factory = Callable[..., Any]
"""Returns a `MultiAgentEnv` or a `gymnasium.Env` (adapted as `gym:<id>` envs are)."""

_ENVS = "sfbus_components.envs"
# The built-in families by prefix, as import strings so nothing heavy loads until used; each
# names the extra that installs what it needs (pyproject.toml's optional dependencies).
FAMILIES: dict[str, EnvFamily] = {
    "doom_": EnvFamily(f"{_ENVS}.doom.family:resolve_scenario",
                       "'doom_<scenario>' for VizDoom's and Sample Factory's scenarios (and "
                       "'doom_duel')",
                       ("vizdoom", "cv2"), "sfbus[doom]", f"{_ENVS}.doom.family:doom_names"),
    "doom:": EnvFamily(f"{_ENVS}.doom.family:resolve_cfg",
                       "'doom:<path.cfg>' for a VizDoom scenario of your own",
                       ("vizdoom", "cv2"), "sfbus[doom]"),
    "atari_": EnvFamily(f"{_ENVS}.atari.game:resolve",
                        "'atari_<game>' for the Atari games of ale-py", ("ale_py", "cv2"),
                        "sfbus[atari]", f"{_ENVS}.atari.game:atari_names"),
    "mujoco_": EnvFamily(f"{_ENVS}.mujoco.tasks:resolve",
                         "'mujoco_<name>' for gymnasium's MuJoCo envs", ("mujoco",),
                         "sfbus[mujoco]", f"{_ENVS}.mujoco.tasks:mujoco_names"),
    "gym:": EnvFamily(f"{_ENVS}.gym.adapter:resolve", "'gym:<EnvId>' for any gymnasium id",
                      ("gymnasium",)),
    "pettingzoo:": EnvFamily(f"{_ENVS}.pettingzoo.adapter:resolve", "'pettingzoo:<module>' for "
                             "a PettingZoo parallel env", ("pettingzoo",), "sfbus[multiagent]"),
    "envpool:": EnvFamily(f"{_ENVS}.envpool.pool:resolve",
                          "'envpool:<TaskId>' for EnvPool's tasks", ("envpool",),
                          "sfbus[envpool]"),
}
"""Built-in env families: name prefix -> how its names resolve."""

# Short names of built-in envs, as import strings so nothing heavy loads until used.
_REGISTRY: dict[str, Factory | str] = {
    "toy_multi_agent": f"{_ENVS}.multi_agent:make_toy_env",
}
_FAMILIES: dict[str, EnvFamily] = {}
"""Families registered in this process (`register_env_family`)."""
_SPEC_CACHE: dict[tuple[str, str], EnvSpec] = {}
CARRIED_ENVS = "SFBUS_ENVS"
"""Environment variable: JSON of the names registered in a launching process -> import paths."""
CARRIED_FAMILIES = "SFBUS_ENV_FAMILIES"
"""Environment variable: JSON of the families registered in a launching process, by prefix."""
ENTRY_POINT_GROUP = "sfbus.envs"
FAMILY_ENTRY_POINT_GROUP = "sfbus.env_families"
"""Entry points named by a prefix whose object is an `EnvFamily`."""
# Names registered here with a factory that no other process can import (a lambda, a function
# of __main__), with what it is: refused where a run would need it in its other processes.
_LOCAL_ONLY: dict[str, str] = {}


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


def register_env_family(prefix: str, family: EnvFamily) -> None:
    """Resolve the env names starting with `prefix` through `family`, as the built-in families
    are (it takes the place of a built-in of the same prefix), here and in every process this
    one starts afterwards."""
    if not prefix or not isinstance(family, EnvFamily):
        raise TypeError("register_env_family takes a non-empty prefix and an EnvFamily")
    _FAMILIES[prefix] = family
    carried = {p: dataclasses.asdict(f) for p, f in _carried_families().items()}
    carried[prefix] = dataclasses.asdict(family)
    os.environ[CARRIED_FAMILIES] = json.dumps(carried)


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
    """Registered short names (`register_env`, `sfbus.envs` entry points) and the names every
    family lists whose packages are installed (`doom_<scenario>`, `atari_<game>`, ...), sorted
    (open-ended families such as `gym:<Id>` list none)."""
    names = set(_REGISTRY) | set(_carried()) | set(_entry_points())
    for family in families().values():
        names.update(_family_names(family))
    return sorted(names)


def families() -> dict[str, EnvFamily]:
    """Every env family by prefix: the built-in ones, then those of `sfbus.env_families` entry
    points, of the launching process and of this one (a later one replaces an earlier)."""
    return {**FAMILIES, **_entry_point_families(), **_carried_families(), **_FAMILIES}


def check_installed(name: str) -> None:
    """Raise `EnvNotInstalledError` when env `name` is of a family whose packages are not
    installed (nothing is imported: the data path's settings check it where they are read, so
    the error points at the `env:` that named it)."""
    if name in _REGISTRY or name in _carried() or name in _entry_points():
        return  # a registered name: its own factory, whatever its prefix
    family = _family_of(name, families())
    if family is not None:
        family.check_installed(name)


def _family_of(name: str, known: dict[str, EnvFamily]) -> EnvFamily | None:
    """The family of `known` whose prefix `name` starts with (the longest), or None."""
    prefix = max((p for p in known if name.startswith(p)), key=len, default=None)
    return None if prefix is None else known[prefix]


def _resolve(name: str) -> Factory:
    registered = _registered(name)
    if registered is not None:
        return registered
    known = families()
    family = _family_of(name, known)
    if family is not None:
        return _resolve_in(family, name)
    if ":" in name:
        return _import(name, name)
    raise _unknown(name, known)


def _resolve_in(family: EnvFamily, name: str) -> Factory:
    """The factory of env `name` from `family`'s resolver, once its packages import."""
    for module in family.requires:
        try:
            importlib.import_module(module)
        except ImportError as error:
            absent = isinstance(error, ModuleNotFoundError) and error.name == module
            why = "is not installed" if absent else f"fails to import ({error})"
            raise family.not_installed(name, module, why) from None
    resolve = _import(family.resolve, name)
    return resolve(name)


def _family_names(family: EnvFamily) -> list[str]:
    """The names `family` lists; none when it lists none or its packages are missing."""
    if not family.names:
        return []
    try:
        return list(import_object(family.names)())
    except (ImportError, ImportPathError):  # vizdoom, ale-py, ... missing: nothing to offer
        return []


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


@functools.cache
def _entry_point_families() -> dict[str, EnvFamily]:
    """The families of installed packages' `sfbus.env_families` entry points, by prefix."""
    found: dict[str, EnvFamily] = {}
    for entry in entry_points(group=FAMILY_ENTRY_POINT_GROUP):
        try:
            family = entry.load()
        except (ImportError, AttributeError) as e:
            raise UnknownEnvError(f"env family {entry.name!r}: its entry point {entry.value!r} "
                                  f"(group {FAMILY_ENTRY_POINT_GROUP}) cannot be loaded: {e}") \
                from e
        if not isinstance(family, EnvFamily):
            raise UnknownEnvError(f"env family {entry.name!r}: its entry point {entry.value!r} "
                                  f"is a {type(family).__name__}, not an EnvFamily")
        found[entry.name] = family
    return found


def _carried() -> dict[str, str]:
    """Names registered by the process that started this one (or by this one), by import path."""
    return _carried_json(CARRIED_ENVS, "env names -> 'module:factory' paths")


def _carried_families() -> dict[str, EnvFamily]:
    """Families registered by the process that started this one (or by this one), by prefix."""
    carried = _carried_json(CARRIED_FAMILIES, "prefixes -> EnvFamily fields")
    try:
        return {prefix: EnvFamily(**{**fields, "requires": tuple(fields.get("requires", ()))})
                for prefix, fields in carried.items()}
    except TypeError as error:
        raise UnknownEnvError(f"environment variable {CARRIED_FAMILIES}: {error}") from None


def _carried_json(variable: str, what: str) -> dict[str, Any]:
    text = os.environ.get(variable)
    try:
        carried = json.loads(text) if text else {}
    except json.JSONDecodeError:
        carried = None
    if not isinstance(carried, dict):
        raise UnknownEnvError(f"environment variable {variable} is not a JSON object of "
                              f"{what}: {text!r}")
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


def _unknown(name: str, known: dict[str, EnvFamily]) -> UnknownEnvError:
    """An unknown name's error: close names, the short ones and every family's pattern (a
    family of more than 80 names, as the Atari games, is named by its pattern alone)."""
    shown = set(_REGISTRY) | set(_carried()) | set(_entry_points())
    candidates = set(shown)
    for family in known.values():
        listed = _family_names(family)
        candidates.update(listed)
        if len(listed) <= 80:
            shown.update(listed)
    patterns = ", ".join(family.about for family in known.values())
    return unknown_env(name, sorted(candidates), shown=sorted(shown),
                       tail=f"; also {patterns} and 'pkg.module:factory' for your own")
