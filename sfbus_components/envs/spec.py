"""The environment interface every rollout worker drives: a spec plus a multi-agent step.

Conventions (Sample Factory's):

- Observations are dicts of named fields; a batch of them is one array per field shaped
  `[num_agents, *field.shape]`. Images are channels-first uint8 (`obs: (3, 72, 128)`).
- Actions are one array per env: `int64 [num_agents, num_heads]` (one categorical per head),
  `float32 [num_agents, *action_box.shape]` (a Gaussian per dimension), or for a hybrid action
  (heads and a Box together) `float32 [num_agents, num_heads + box size]`: the heads' choices
  as whole numbers, then the Box's values flattened.
- An observation key `action_mask` (one entry per categorical action, the heads' entries
  concatenated; bool, int or float, > 0 = allowed) masks the actions of that step, as in Sample
  Factory 2.x: masked actions are never sampled and their probability is 0 in the loss. The
  built-in encoders do not read it.
- An episode that ends is reset at once inside `step`: the observation returned for that agent is
  the first one of the next episode, and that agent's info carries the finished episode's
  `episode_return`, `episode_length` (env steps) and `episode_frames` (engine frames).
- Heterogeneous agents (`spec.agent_specs`: agents whose observation or action spaces differ,
  such as MPE's predators and prey) cannot share arrays: such an env takes `actions` as a
  sequence of each agent's own action array (`[*action_shape]` of its spec) and writes into
  `obs_out`, a sequence of each agent's own observation dict (fields `[*shape]`, no agent axis).
  Rewards, terminations, truncations and infos stay one entry per agent.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)

ACTION_MASK_KEY = "action_mask"
"""The observation key of an action mask (see the module's docstring)."""
ObsDict = dict[str, np.ndarray]
AgentObs = list[ObsDict]
"""A heterogeneous env's observations: one dict per agent, fields without an agent axis."""
StepOutput = tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]


class EnvError(RuntimeError):
    """The environment broke under us (its engine died, hung, or left a bad state).

    Not the caller's fault: drop the env object and create a fresh one with the same arguments.
    """


@dataclass(frozen=True)
class ObsField:
    """One observation field: the shape of one agent's array and its numpy dtype name."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        np.dtype(self.dtype)  # fail early on a typo such as "unit8"


class ActionBox(NamedTuple):
    """A continuous action space: per-dimension bounds (flattened) and the action shape."""

    low: tuple[float, ...]
    high: tuple[float, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class EnvSpec:
    """What a model and a rollout worker need to know about an environment, fixed per env."""

    observation_space: dict[str, ObsField]
    """Field name -> shape and dtype of one agent's observation."""
    action_heads: tuple[int, ...] = ()
    """Number of choices of each categorical head (discrete / multi-discrete); empty if Box."""
    action_box: ActionBox | None = None
    """Bounds and shape of a continuous action (Gaussian heads); None if discrete. Given with
    `action_heads`, the action is hybrid: the heads' choices, then the Box."""
    num_agents: int = 1
    """Agents stepped together by one env (1 for single-agent envs)."""
    frameskip: int = 1
    """Engine frames per env step, to count env frames the way the paper does."""
    reward_scale: float = 1.0
    """Factor the learner applies to this env's rewards before its own `reward_scale` (Sample
    Factory scales some scenarios' rewards inside the env, e.g. VizDoom basic's by 0.01; here
    the env reports its game's rewards and the learner scales them)."""
    agent_names: tuple[str, ...] = ()
    """The agents' names in row order (a PettingZoo env's ``possible_agents``), which a run's
    ``agent_policies`` maps to policies; empty: the agents are unnamed."""
    agent_specs: tuple[EnvSpec, ...] = ()
    """Heterogeneous agents: each agent's own spec (``num_agents`` 1), in row order, where the
    agents' observation or action spaces differ; this spec's own spaces are then agent 0's.
    Empty: every agent has this spec's spaces."""

    def __post_init__(self) -> None:
        if not self.action_heads and self.action_box is None:
            raise ValueError("an EnvSpec needs action_heads, an action_box or both")
        for what, given in (("agent_names", self.agent_names), ("agent_specs", self.agent_specs)):
            if given and len(given) != self.num_agents:
                raise ValueError(f"{what} has {len(given)} entries for {self.num_agents} agents")
        if any(s.num_agents != 1 or s.agent_specs for s in self.agent_specs):
            raise ValueError("each of agent_specs is one agent's spec (num_agents 1)")
        mask = self.observation_space.get(ACTION_MASK_KEY)
        if mask is not None and mask.shape != (sum(self.action_heads),):
            raise ValueError(f"observation '{ACTION_MASK_KEY}' has shape {list(mask.shape)}, "
                             f"but the action heads {list(self.action_heads)} need "
                             f"[{sum(self.action_heads)}] (one entry per categorical action)")
        if self.num_agents < 1 or self.frameskip < 1:
            raise ValueError("num_agents and frameskip must be >= 1")
        if not 0.0 < self.reward_scale < math.inf:
            raise ValueError(f"reward_scale must be positive and finite, not {self.reward_scale}")

    @property
    def heterogeneous(self) -> bool:
        """True when the agents' spaces differ (``agent_specs``): actions and observations then
        go one array or dict per agent (see the module's docstring)."""
        return bool(self.agent_specs)

    def spaces_equal(self, other: EnvSpec) -> bool:
        """Whether ``other`` has this spec's observation and action spaces (one agent's)."""
        return (self.observation_space == other.observation_space
                and self.action_heads == other.action_heads
                and self.action_box == other.action_box)

    def describe_spaces(self) -> str:
        """One agent's observation and action spaces, for messages."""
        obs = ", ".join(f"{k} {f.dtype} {list(f.shape)}" for k, f in
                        self.observation_space.items())
        actions = [f"heads {list(self.action_heads)}"] if self.action_heads else []
        if self.action_box is not None:
            actions.append(f"box {list(self.action_box.shape)}")
        return f"observation {{{obs}}}, actions {' + '.join(actions)}"

    @property
    def is_continuous(self) -> bool:
        """True when actions are floats with a Box part (continuous or hybrid)."""
        return self.action_box is not None

    @property
    def is_hybrid(self) -> bool:
        """True when an action is categorical heads and a Box together."""
        return bool(self.action_heads) and self.action_box is not None

    @property
    def box_size(self) -> int:
        """Number of the Box's dimensions (0 without a Box)."""
        return 0 if self.action_box is None else math.prod(self.action_box.shape)

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of one agent's action: `(num_heads,)`, the Box shape, or for a hybrid action
        `(num_heads + box_size,)`."""
        if self.action_box is None:
            return (len(self.action_heads),)
        if self.action_heads:
            return (len(self.action_heads) + self.box_size,)
        return self.action_box.shape

    @property
    def action_params_size(self) -> int:
        """Width of an action distribution's parameters: the heads' logits, then a Gaussian's
        mean and log-std."""
        return sum(self.action_heads) + 2 * self.box_size

    @property
    def action_dtype(self) -> str:
        """Numpy dtype name of actions: int64 for heads only, float32 with a Box (hybrid too)."""
        return "float32" if self.is_continuous else "int64"

    def empty_obs(self) -> ObsDict:
        """Zeroed observation arrays `[num_agents, *shape]` per field, for `step_into`."""
        return {k: np.zeros((self.num_agents, *f.shape), f.dtype)
                for k, f in self.observation_space.items()}

    def random_actions(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` uniform random actions (standard normal for a Box) and their log-probabilities:
        the trivial policy of sampler benchmarks and tests."""
        if self.is_hybrid:
            heads, head_log_prob = self._uniform_heads
            box, log_probs = self._standard_normal(rng, n, (self.box_size,))
            choices = np.floor(rng.random((n, len(heads))) * heads).astype(np.float32)
            return np.concatenate([choices, box], axis=1), log_probs + head_log_prob
        if self.is_continuous:
            return self._standard_normal(rng, n, self.action_shape)
        heads, log_prob = self._uniform_heads
        # Scaling uniform floats in [0, 1) is 4x cheaper than Generator.integers with per-head
        # bounds (it is drawn for every request of a sampler benchmark), and never reaches a head.
        actions = (rng.random((n, len(heads))) * heads).astype(np.int64)
        return actions, np.full(n, log_prob)

    @staticmethod
    def _standard_normal(rng: np.random.Generator, n: int,
                         shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """``n`` standard normal float32 actions of ``shape`` and their log-probabilities."""
        actions = rng.standard_normal((n, *shape), dtype=np.float32)
        return actions, (-0.5 * np.square(actions) - _LOG_SQRT_2PI).reshape(n, -1).sum(1)

    @cached_property
    def _uniform_heads(self) -> tuple[np.ndarray, float]:
        """The action heads as a float array and a uniform action's log-probability."""
        heads = np.asarray(self.action_heads, np.float64)
        return heads, float(-np.log(heads).sum())

    def empty_actions(self) -> np.ndarray:
        """A no-op-shaped zero action array `[num_agents, *action_shape]`."""
        return np.zeros((self.num_agents, *self.action_shape), self.action_dtype)

    def empty_agent_obs(self) -> AgentObs:
        """A heterogeneous env's zeroed observations: one dict per agent, of its own fields."""
        return [{k: np.zeros(f.shape, f.dtype) for k, f in s.observation_space.items()}
                for s in self.agent_specs]

    def random_agent_actions(self, rng: np.random.Generator) -> list[np.ndarray]:
        """A heterogeneous env's random actions: one array per agent, of its own space."""
        return [s.random_actions(rng, 1)[0][0] for s in self.agent_specs]


class MultiAgentEnv(abc.ABC):
    """An env stepping `spec.num_agents` agents in lockstep, with in-place observation writes.

    Subclasses implement `spec`, `reset_into`, `step_into` and `close`; `reset`/`step` are
    allocating conveniences built on them. Not thread-safe; one env object per worker.
    """

    @property
    @abc.abstractmethod
    def spec(self) -> EnvSpec:
        """The env's fixed spec."""

    @abc.abstractmethod
    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Start new episodes for every agent and write first observations into `obs_out`."""

    @abc.abstractmethod
    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step once; write next observations into `obs_out` (rows `[num_agents, ...]`).

        Returns `(rewards float32[n], terminated bool[n], truncated bool[n], infos)`. Raises
        `EnvError` if the env broke and must be recreated.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the env's resources; safe to call twice."""

    def reset(self, seed: int | None = None) -> list[ObsDict]:
        """Start new episodes; return one observation dict per agent (fresh arrays)."""
        if self.spec.heterogeneous:
            agents = self.spec.empty_agent_obs()
            self.reset_into(agents, seed=seed)
            return agents
        buf = self.spec.empty_obs()
        self.reset_into(buf, seed=seed)
        return _split(buf, self.spec.num_agents)

    def step(self, actions: np.ndarray) -> tuple[list[ObsDict], np.ndarray, np.ndarray,
                                                 np.ndarray, list[dict[str, Any]]]:
        """Step once; return `(obs per agent, rewards, terminated, truncated, infos)`."""
        if self.spec.heterogeneous:
            agents = self.spec.empty_agent_obs()
            rewards, terminated, truncated, infos = self.step_into(actions, agents)
            return agents, rewards, terminated, truncated, infos
        buf = self.spec.empty_obs()
        rewards, terminated, truncated, infos = self.step_into(actions, buf)
        return _split(buf, self.spec.num_agents), rewards, terminated, truncated, infos

    def __enter__(self) -> MultiAgentEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EnvWrapper(MultiAgentEnv):
    """A `MultiAgentEnv` around another, `env`: the same spec, and every attribute it does not
    define is the wrapped env's (reward_shaping, game, render, ...)."""

    def __init__(self, env: MultiAgentEnv) -> None:
        self.env = env

    @property
    def spec(self) -> EnvSpec:
        """The wrapped env's spec."""
        return self.env.spec

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet (during unpickling or a failed __init__)
            raise AttributeError(name)
        return getattr(self.env, name)


def _split(buf: ObsDict, n: int) -> list[ObsDict]:
    return [{k: v[i] for k, v in buf.items()} for i in range(n)]


class EpisodeStats:
    """Per-agent running return/length, turned into the episode info keys at episode end."""

    __slots__ = ("frameskip", "lengths", "returns")

    def __init__(self, num_agents: int, frameskip: int) -> None:
        self.returns = np.zeros(num_agents, np.float64)
        self.lengths = np.zeros(num_agents, np.int64)
        self.frameskip = frameskip

    def add(self, rewards: np.ndarray) -> None:
        """Count one step with these rewards for every agent."""
        self.returns += rewards
        self.lengths += 1

    def finish(self, agent: int, info: dict[str, Any]) -> None:
        """Write agent's finished-episode stats into `info` and zero its counters."""
        info["episode_return"] = float(self.returns[agent])
        info["episode_length"] = int(self.lengths[agent])
        info["episode_frames"] = int(self.lengths[agent]) * self.frameskip
        self.returns[agent] = 0.0
        self.lengths[agent] = 0

    def clear(self) -> None:
        """Zero every agent's counters (on reset)."""
        self.returns[:] = 0.0
        self.lengths[:] = 0
