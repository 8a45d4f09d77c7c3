"""What any env a factory returns must satisfy, checked before a run starts.

`adapt` takes what a factory returned: a `MultiAgentEnv` as it is, a `gymnasium.Env` through
the `gym:<id>` adapter, anything else refused. `check_env` resets and steps the env once and
compares what comes back with the spec it declares (a gymnasium env: with its own
`observation_space`, before the adapter casts anything), so that an env whose observations do not
match is refused at validation, naming the env, the field, and expected against got, instead of
failing (or silently casting) inside a rollout worker.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from sfbus_components.envs.spec import EnvSpec, MultiAgentEnv, ObsDict, ObsField


class EnvSpecError(ValueError):
    """The env does not match the spec it declares, or is not an env at all: the env author's
    fault; fix the env or its declared spaces. Raised at validation (exit 2)."""


def adapt(env: Any, name: str) -> MultiAgentEnv:
    """`env` as a MultiAgentEnv: itself, or a `gymnasium.Env` through the gym adapter."""
    if isinstance(env, MultiAgentEnv):
        return env
    import gymnasium as gym

    if not isinstance(env, gym.Env):
        raise EnvSpecError(f"env {name!r}: its factory returned a {type(env).__qualname__}, not "
                           "a gymnasium.Env or a sfbus_components.envs.MultiAgentEnv")
    from sfbus_components.envs.gym.adapter import GymEnv

    try:
        return GymEnv(env)
    except TypeError as error:  # a space the adapter cannot take
        env.close()
        raise EnvSpecError(f"env {name!r}: {error}") from None


def check_env(env: MultiAgentEnv, name: str) -> EnvSpec:
    """Reset and step `env` once with random actions; return its spec if what it returned
    matches the spec, else raise `EnvSpecError`."""
    # Only a GymEnv wraps a gymnasium env, and it exists only once its module was imported: a
    # Doom or Atari check need not load gymnasium.
    adapter = sys.modules.get("sfbus_components.envs.gym.adapter")
    if adapter is not None and isinstance(env, adapter.GymEnv):
        _check_gym(env.env, name)
    spec = env.spec
    if not isinstance(spec, EnvSpec):
        raise EnvSpecError(f"env {name!r}: its spec is a {type(spec).__qualname__}, not an "
                           "EnvSpec")
    fields = spec.observation_space
    if not isinstance(fields, dict) or not fields or not all(
            isinstance(f, ObsField) for f in fields.values()):
        raise EnvSpecError(f"env {name!r}: spec.observation_space must be a non-empty dict of "
                           f"field name -> ObsField, got {fields!r}")
    if spec.heterogeneous:
        return _check_agents(env, name, spec)
    obs = spec.empty_obs()
    _call(name, "reset_into", env.reset_into, obs, seed=0)
    _check_fields(name, "reset_into", spec, obs)
    actions, _ = spec.random_actions(np.random.default_rng(0), spec.num_agents)
    out = _call(name, "step_into", env.step_into, actions, obs)
    _check_fields(name, "step_into", spec, obs)
    _check_step_output(name, spec.num_agents, out)
    return spec


def _check_agents(env: MultiAgentEnv, name: str, spec: EnvSpec) -> EnvSpec:
    """`check_env` of a heterogeneous env: observations and actions one per agent."""
    obs = spec.empty_agent_obs()
    _call(name, "reset_into", env.reset_into, obs, seed=0)
    _check_agent_fields(name, "reset_into", spec, obs)
    actions = spec.random_agent_actions(np.random.default_rng(0))
    out = _call(name, "step_into", env.step_into, actions, obs)
    _check_agent_fields(name, "step_into", spec, obs)
    _check_step_output(name, spec.num_agents, out)
    return spec


def _check_agent_fields(name: str, what: str, spec: EnvSpec, obs: list[ObsDict]) -> None:
    """Every agent's observation dict must hold its own fields, written in place."""
    for i, (agent, fields) in enumerate(zip(spec.agent_specs, obs, strict=True)):
        for key, field in agent.observation_space.items():
            got = fields.get(key)
            if not isinstance(got, np.ndarray) or got.shape != field.shape \
                    or got.dtype != field.dtype:
                raise EnvSpecError(
                    f"env {name!r}: after {what} agent {i}'s observation field {key!r} is "
                    f"{_describe(got)}, but its spec declares {field.dtype} "
                    f"{list(field.shape)} (write into obs_out[agent][field][...])")


def _call(name: str, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return method(*args, **kwargs)
    except Exception as error:
        raise EnvSpecError(f"env {name!r}: {what} raised {type(error).__name__}: "
                           f"{error}") from error


def _check_fields(name: str, what: str, spec: EnvSpec, obs: ObsDict) -> None:
    """The env must write into the arrays it was given, not put others in their place."""
    if set(obs) != set(spec.observation_space):
        raise EnvSpecError(f"env {name!r}: after {what} the observation has fields "
                           f"{sorted(obs)}, but its spec declares {sorted(spec.observation_space)}")
    for key, field in spec.observation_space.items():
        got = obs[key]
        expected = (spec.num_agents, *field.shape)
        if not isinstance(got, np.ndarray) or got.shape != expected or got.dtype != field.dtype:
            raise EnvSpecError(
                f"env {name!r}: after {what} observation field {key!r} is "
                f"{_describe(got)}, but its spec declares {field.dtype} {list(expected)} "
                "(write into obs_out[field][...] rather than replacing the array)")


def _check_step_output(name: str, agents: int, out: Any) -> None:
    if not isinstance(out, tuple) or len(out) != 4:
        raise EnvSpecError(f"env {name!r}: step_into must return (rewards, terminated, "
                           f"truncated, infos), got {_describe(out)}")
    for what, value in zip(("rewards", "terminated", "truncated"), out[:3], strict=False):
        if np.shape(value) != (agents,):
            raise EnvSpecError(f"env {name!r}: step_into returned {what} of shape "
                               f"{list(np.shape(value))}, expected [{agents}] (one per agent)")
    infos = out[3]
    if not isinstance(infos, list) or len(infos) != agents or not all(
            isinstance(i, dict) for i in infos):
        raise EnvSpecError(f"env {name!r}: step_into returned infos {_describe(infos)}, "
                           f"expected a list of {agents} dict(s) (one per agent)")


def _check_gym(env: Any, name: str) -> None:
    """What the gymnasium env itself returns against its own observation_space."""
    space = env.observation_space
    obs = _call(name, "reset()", env.reset, seed=0)[0]
    _check_gym_obs(name, "reset()", space, obs)
    obs = _call(name, "step()", env.step, env.action_space.sample())[0]
    _check_gym_obs(name, "step()", space, obs)


def _check_gym_obs(name: str, what: str, space: Any, obs: Any, key: str = "obs") -> None:
    """An observation of a space the adapter takes (Box, Discrete, MultiBinary, a Dict of them)
    against that space; ``key`` names it in the error."""
    from gymnasium import spaces

    def refuse(got: str, expected: str) -> EnvSpecError:
        return EnvSpecError(f"env {name!r}: {what} returned observation {key!r} with {got}, "
                            f"but its observation_space declares {expected}")

    if isinstance(space, spaces.Dict):
        if not isinstance(obs, dict) or set(obs) != set(space.spaces):
            got = f"keys {sorted(obs)}" if isinstance(obs, dict) else f"a {type(obs).__qualname__}"
            raise refuse(got, f"a dict of keys {sorted(space.spaces)}")
        for sub_key, sub_space in space.spaces.items():
            _check_gym_obs(name, what, sub_space, obs[sub_key], sub_key)
    elif isinstance(space, spaces.Box | spaces.MultiBinary):
        if not isinstance(obs, np.ndarray):
            raise refuse(f"a {type(obs).__qualname__}",
                         f"a numpy array {space.dtype} {list(space.shape)}")
        if obs.shape != space.shape:
            raise refuse(f"shape {list(obs.shape)}", f"shape {list(space.shape)}")
        if obs.dtype != space.dtype:
            raise refuse(f"dtype {obs.dtype}", f"dtype {space.dtype} (cast the observation, "
                         "or declare the space with the dtype the env returns)")
    elif isinstance(space, spaces.Discrete):
        if not isinstance(obs, int | np.integer) and not (
                isinstance(obs, np.ndarray) and obs.shape == () and obs.dtype.kind in "iu"):
            raise refuse(f"a {type(obs).__qualname__}", "an integer (Discrete)")
        if not space.start <= int(obs) < space.start + space.n:
            raise refuse(f"value {int(obs)}", f"Discrete({space.n}, start={space.start})")


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {list(value.shape)}"
    return f"a {type(value).__qualname__}"


def import_path(factory: Callable[..., Any]) -> str | None:
    """`module:qualname` by which another process imports `factory`, or None where it cannot (a
    lambda, a local function, one of `__main__`, an object without a name)."""
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is factory else None
