"""A tiny multi-agent env proving the interface for `num_agents > 1` (and a fast test env).

Every agent sees the same vector: a one-hot of a hidden target in `[0, num_actions)` that changes
every step. An agent earns +1 for choosing the target, 0 otherwise, so a policy can learn it in a
few hundred steps. Episodes last `episode_length` steps and end by truncation, for all agents.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sfbus_components.envs.spec import (
    EnvSpec,
    EpisodeStats,
    MultiAgentEnv,
    ObsDict,
    ObsField,
    StepOutput,
)


class ToyMultiAgentEnv(MultiAgentEnv):
    """`num_agents` agents each guessing the same observed target."""

    def __init__(self, num_agents: int = 2, num_actions: int = 4, episode_length: int = 16,
                 seed: int | None = None) -> None:
        self._spec = EnvSpec({"obs": ObsField((num_actions,), "float32")},
                             action_heads=(num_actions,), num_agents=num_agents)
        self._n = num_actions
        self._episode_length = episode_length
        self._rng = np.random.default_rng(seed)
        self._stats = EpisodeStats(num_agents, 1)
        self._target = 0
        self._t = 0

    @property
    def spec(self) -> EnvSpec:
        """The env's fixed spec."""
        return self._spec

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Start an episode for all agents; write the shared first observation."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        self._stats.clear()
        self._observe(obs_out)

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Reward each agent whose head-0 action equals the target; auto-reset after the end."""
        rewards = (actions[:, 0] == self._target).astype(np.float32)
        self._stats.add(rewards)
        self._t += 1
        n = self._spec.num_agents
        infos: list[dict[str, Any]] = [{} for _ in range(n)]
        done = self._t >= self._episode_length
        if done:
            for i in range(n):
                self._stats.finish(i, infos[i])
            self._t = 0
        self._observe(obs_out)
        return rewards, np.zeros(n, bool), np.full(n, done), infos

    def close(self) -> None:
        """Nothing to release."""

    def _observe(self, obs_out: ObsDict) -> None:
        self._target = int(self._rng.integers(self._n))
        obs = obs_out["obs"]
        obs[:] = 0.0
        obs[:, self._target] = 1.0


def make_toy_env(num_agents: int = 2, num_actions: int = 4, episode_length: int = 16,
                 seed: int | None = None) -> ToyMultiAgentEnv:
    """Create the toy multi-agent env."""
    return ToyMultiAgentEnv(num_agents, num_actions, episode_length, seed)
