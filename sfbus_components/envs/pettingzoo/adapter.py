"""A PettingZoo parallel env as a `MultiAgentEnv`: env names `pettingzoo:<registry id>`,
`pettingzoo:<module>` (its `parallel_env`) and `pettingzoo:<module>:<factory>`.

Agents are the rows of every array in the order of the env's `possible_agents`, fixed for the
env's life, and the spec names them (`EnvSpec.agent_names`). Their spaces are converted as `gym:`
envs' are (`sfbus_components.envs.gym.adapter`). Agents that differ in observation or action space
(MPE's `simple_tag`: predators see 16 numbers, prey 14) make a heterogeneous env
(`EnvSpec.agent_specs`: actions and observations one per agent, see
`sfbus_components.envs.spec`); a run maps each of them to a policy of its space by name
(`agent_policies`, docs/ENVIRONMENTS.md).

An agent that leaves before the others (PettingZoo drops it from `agents`) is reported finished on
the step it leaves (its `terminated`/`truncated` and episode stats). Until the env's episode ends
its row stays, inactive: zero observation, reward 0 and `terminated` on every step (a one-step
episode of return 0 with no stats, so the learner's value target stays 0 and no episode is
reported), and no action is sent for it. Every info carries `is_active` (the agent acted this
step). When no agent is left the env resets inside `step`, and every row gets the next episode's
first observation; an agent absent at a reset is inactive until it appears.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from sfbus_components.envs.family import EnvNotInstalledError, UnknownEnvError
from sfbus_components.envs.gym.adapter import GymAction, _action_space, _obs_field
from sfbus_components.envs.spec import (
    AgentObs,
    EnvSpec,
    EpisodeStats,
    MultiAgentEnv,
    ObsDict,
    StepOutput,
)

PREFIX = "pettingzoo:"
# Env packages outside PettingZoo that the multiagent extra installs.
_IN_EXTRA = ("mpe2",)


class AgentSpacesError(ValueError):
    """An agent's space cannot be converted, or the env is not a parallel env: the env's (or its
    settings') fault; pick another env or wrap it."""


class PettingZooEnv(MultiAgentEnv):
    """Adapter around one PettingZoo `ParallelEnv`; auto-resets it when no agent is left."""

    def __init__(self, env: Any, name: str, seed: int | None = None) -> None:
        self.env = env
        self.agents: tuple[str, ...] = tuple(env.possible_agents)
        """Agent names in row order."""
        specs, self._one_hot, self._actions = _agent_spaces(env, self.agents, name)
        first = specs[0]
        same = all(s.spaces_equal(first) for s in specs)
        self._spec = EnvSpec(first.observation_space, first.action_heads, first.action_box,
                             num_agents=len(self.agents), agent_names=self.agents,
                             agent_specs=() if same else tuple(specs))
        self._seed = seed
        self._stats = EpisodeStats(len(self.agents), 1)
        self._live = np.zeros(len(self.agents), bool)

    @property
    def spec(self) -> EnvSpec:
        """The env's fixed spec."""
        return self._spec

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Reset the env (the first reset uses the constructor's seed) into `obs_out`."""
        if seed is None:
            seed, self._seed = self._seed, None
        self._reset(obs_out, seed)

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step the live agents with their rows of `actions`; rows of absent agents read as
        inactive (see the module's docstring); reset inside the step when no agent is left."""
        acting = self._live  # replaced, never written in place, below
        convert = self._actions
        obs, rewards, terms, truncs, infos = self.env.step(
            {a: convert[i](actions[i]) for i, a in enumerate(self.agents) if acting[i]})
        reward = np.array([rewards.get(a, 0.0) for a in self.agents], np.float32)
        terminated = np.array([bool(terms.get(a, False)) for a in self.agents])
        truncated = np.array([bool(truncs.get(a, False)) for a in self.agents])
        out_infos: list[dict[str, Any]] = [
            {**infos.get(a, {}), "is_active": bool(acting[i])} for i, a in enumerate(self.agents)]
        live = set(self.env.agents)
        now_live = np.array([a in live for a in self.agents])
        # An agent that left with neither flag set (against the API) had its episode cut.
        truncated |= acting & ~now_live & ~terminated
        self._stats.add(reward)
        for i in np.flatnonzero(acting & (terminated | truncated)):
            self._stats.finish(int(i), out_infos[i])
        # An agent idle this step: one terminal step of return 0 that starts no episode.
        terminated |= ~acting
        if live:
            self._live = now_live
            self._stats.returns[~now_live] = 0.0
            self._stats.lengths[~now_live] = 0
            self._write(obs, obs_out)
        else:  # every agent is done: the next episode's first observations, for every row
            self._reset(obs_out, None)
        return reward, terminated, truncated, out_infos

    def close(self) -> None:
        """Close the PettingZoo env."""
        self.env.close()

    def _reset(self, obs_out: ObsDict, seed: int | None) -> None:
        obs, _ = self.env.reset(seed=seed)
        live = set(self.env.agents)
        self._live = np.array([a in live for a in self.agents])
        self._stats.clear()
        self._write(obs, obs_out)

    def _write(self, obs: dict[str, Any], obs_out: ObsDict | AgentObs) -> None:
        """Each live agent's observation into its row (a heterogeneous env's: into its own
        dict); zeros for the others."""
        rows = [o["obs"] for o in obs_out] if self._spec.agent_specs else obs_out["obs"]
        for i, agent in enumerate(self.agents):
            row = rows[i]
            if not self._live[i] or agent not in obs:
                row[:] = 0
            elif self._one_hot[i]:
                row[:] = 0.0
                row[int(obs[agent])] = 1.0
            else:
                np.copyto(row, obs[agent], casting="unsafe")


def _agent_spaces(env: Any, agents: tuple[str, ...],
                  name: str) -> tuple[list[EnvSpec], list[bool], list[GymAction]]:
    """Each agent's spec (one agent's spaces), whether its observation is a one-hot of a
    Discrete, and its action converter; `AgentSpacesError` for a space that cannot be taken."""
    if not agents:
        raise AgentSpacesError(f"env {name!r} has no agents (its possible_agents is empty)")
    specs, one_hot, convert = [], [], []
    for agent in agents:
        try:
            field, is_one_hot = _obs_field(env.observation_space(agent))
            heads, box = _action_space(env.action_space(agent))
        except TypeError as e:
            raise AgentSpacesError(f"env {name!r}: agent {agent!r}: {e}") from None
        specs.append(EnvSpec({"obs": field}, action_heads=heads, action_box=box))
        one_hot.append(is_one_hot)
        convert.append(GymAction(env.action_space(agent)))
    return specs, one_hot, convert


def resolve(name: str) -> Callable[..., PettingZooEnv]:
    """The factory of `pettingzoo:<target>` (the registry's `pettingzoo:` family)."""
    return pettingzoo_factory(name[len(PREFIX):])


def pettingzoo_factory(target: str) -> Callable[..., PettingZooEnv]:
    """The factory of env `pettingzoo:<target>`; `UnknownEnvError` if nothing provides it.

    `target` is an id of PettingZoo's parallel registry (`butterfly/pistonball-v6`,
    `classic/rps`: unversioned means the latest), a module with a `parallel_env` function
    (`mpe2.simple_spread_v3`), or `pkg.module:factory`, a callable or class returning a
    `ParallelEnv` (the user's own). The factory's keyword arguments go to it, `seed` aside.
    """
    import pettingzoo  # the registry checked it imports (the multiagent extra)

    name = PREFIX + target
    if "/" in target:
        make, where = _registered(pettingzoo, target, name), f"PettingZoo's {target!r}"
    else:
        module_name, colon, attr = target.partition(":")
        module = _import(module_name, name, _close(pettingzoo, module_name.replace(".", "/")))
        attr = attr if colon else "parallel_env"
        make, where = getattr(module, attr, None), f"{module_name}.{attr}"
        if not callable(make):
            raise UnknownEnvError(f"env {name!r}: module {module_name!r} has no callable "
                                  f"{attr!r}" + ("" if colon else " (a parallel env's module "
                                                 "has one)"))

    def factory(seed: int | None = None, **kwargs: Any) -> PettingZooEnv:
        env = make(**kwargs)
        if isinstance(env, pettingzoo.AECEnv) or not all(
                hasattr(env, k) for k in ("possible_agents", "step", "reset", "action_space")):
            raise AgentSpacesError(f"env {name!r}: {where} returned {type(env).__name__}, not "
                                   "a PettingZoo ParallelEnv (for an AEC env, wrap it in "
                                   "pettingzoo.utils.aec_to_parallel)")
        return PettingZooEnv(env, name, seed)

    return factory


def _registered(pettingzoo: Any, env_id: str, name: str) -> Callable[..., Any]:
    """`pettingzoo.make` for parallel registry id `env_id`, checked now (not when called)."""
    from pettingzoo.env_registry.exceptions import PettingZooRegistryError

    try:
        spec = pettingzoo.spec("parallel", env_id)
    except PettingZooRegistryError:
        try:
            pettingzoo.spec("aec", env_id)
            aec = " (PettingZoo has it as an AEC env only)"
        except PettingZooRegistryError:
            aec = ""
        raise UnknownEnvError(f"unknown env {name!r}{aec}{_close(pettingzoo, env_id)} "
                              "PettingZoo's parallel envs: "
                              f"{', '.join(sorted(pettingzoo.parallel_registry))}") from None

    def make(**kwargs: Any) -> Any:
        try:
            return pettingzoo.make("parallel", spec, **kwargs)
        except PettingZooRegistryError as e:  # FailedToImport: a family's extra is missing
            raise UnknownEnvError(f"env {name!r}: {e}") from e

    return make


def _close(pettingzoo: Any, env_id: str) -> str:
    """A "did you mean" of the parallel registry's ids close to `env_id`, or ''."""
    close = difflib.get_close_matches(env_id, list(pettingzoo.parallel_registry), n=3,
                                      cutoff=0.6)
    return f"; did you mean {' or '.join(repr(PREFIX + c) for c in close)}?" if close else ""


def _import(module_name: str, name: str, hint: str) -> Any:
    """Module `module_name`; `UnknownEnvError` if it is missing or fails to import."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.partition(".")[0]
        if top in _IN_EXTRA and not _imports(top):
            raise EnvNotInstalledError(f"env {name!r} needs the package {top}, which is not "
                                       "installed: pip install 'sfbus[multiagent]'") from None
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UnknownEnvError(
                f"unknown env {name!r}: no module {module_name!r}{hint or '.'} Name an id of "
                "PettingZoo's parallel registry ('pettingzoo:butterfly/pistonball-v6'), a module "
                "with a parallel_env ('pettingzoo:mpe2.simple_spread_v3') or your own factory "
                "('pettingzoo:pkg.module:make_env').") from None
        raise UnknownEnvError(f"env {name!r}: importing {module_name!r} failed: {e}") from e
    except ImportError as e:  # pettingzoo's families raise DependencyNotInstalled(ImportError)
        raise UnknownEnvError(f"env {name!r}: importing {module_name!r} failed: {e}") from e


def _imports(module_name: str) -> bool:
    """Whether module `module_name` imports."""
    try:
        importlib.import_module(module_name)
    except ImportError:
        return False
    return True
