"""Whole episodes played by fixed policies: the loop of the evaluator and of ``sfbus enjoy``.

Each agent acts the way the rollout and inference workers make it act: observations through its
policy's normalizer, the RNN state carried between steps and zeroed when the agent's episode ends.
An env of heterogeneous agents (``EnvSpec.agent_specs``) takes one observation dict and one action
array per agent; each policy then acts for its own agents, their rows stacked.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from sfbus_components.envs import MultiAgentEnv
from sfbus_components.models.policy import Policy


class Episode(NamedTuple):
    """One finished episode of a counted agent."""

    episode_return: float
    length: int
    """Env steps."""
    true_return: float
    """The env's unshaped score (NaN where the env does not shape its reward, or when cut)."""
    cut: bool
    """Ended by ``max_steps`` rather than by the env."""


class EpisodePlayer:
    """Plays episodes of one env, a chunk of steps per call, each agent with its own policy.

    Returns and lengths are counted here from the steps' rewards, so that an episode cut at
    ``max_steps`` has them too. ``before_step`` is called before every step, when the env shows
    the observation about to be acted on (``sfbus enjoy`` films that frame). Not thread-safe: one
    call at a time, from any thread.
    """

    def __init__(self, env: MultiAgentEnv, state_size: int, deterministic: bool = False, *,
                 max_steps: int | None = None,
                 before_step: Callable[[], None] | None = None) -> None:
        self.env = env
        self.spec = spec = env.spec
        self.deterministic = deterministic
        self.max_steps = max_steps
        """Steps after which every running episode is cut and the env reset; None: no limit."""
        self.before_step = before_step
        self.heterogeneous = spec.heterogeneous
        self.obs: Any = spec.empty_agent_obs() if self.heterogeneous else spec.empty_obs()
        self.obs_t: Any = ([{k: torch.from_numpy(v) for k, v in o.items()} for o in self.obs]
                           if self.heterogeneous  # views of self.obs
                           else {k: torch.from_numpy(v) for k, v in self.obs.items()})
        self.actions: Any = ([np.zeros(s.action_shape, s.action_dtype) for s in spec.agent_specs]
                             if self.heterogeneous else spec.empty_actions())
        self.rnn = torch.zeros(spec.num_agents, state_size)
        self.returns = np.zeros(spec.num_agents)
        self.lengths = np.zeros(spec.num_agents, np.int64)
        self.groups: list[tuple[Policy, torch.Tensor]] = []
        self.counted = np.zeros(spec.num_agents, bool)
        self.episodes: list[Episode] = []
        """Finished episodes of counted agents, in the order they ended."""

    def renew(self, make: Callable[[], MultiAgentEnv]) -> None:
        """Replace a broken env with a fresh one from ``make`` (made the same way)."""
        with contextlib.suppress(Exception):  # a broken env may fail to close; the new one matters
            self.env.close()
        self.env = make()

    def start(self, players: Sequence[Policy], counted: Sequence[int], seed: int | None) -> None:
        """New episodes from a reset seeded ``seed``; agent ``i`` acts with ``players[i]`` and
        only the ``counted`` agents' episodes are kept."""
        by_policy: dict[int, tuple[Policy, list[int]]] = {}
        for agent, policy in enumerate(players):
            by_policy.setdefault(id(policy), (policy, []))[1].append(agent)
        self.groups = [(policy, torch.tensor(agents)) for policy, agents in by_policy.values()]
        self.counted[:] = False
        self.counted[list(counted)] = True
        self.episodes = []
        self._restart(seed)

    def play(self, steps: int, wanted: int) -> None:
        """Step up to ``steps`` times, stopping once ``wanted`` episodes finished; raises
        EnvError when the env breaks."""
        with torch.inference_mode():
            for _ in range(steps):
                if len(self.episodes) >= wanted:
                    return
                if self.before_step is not None:
                    self.before_step()
                for policy, agents in self.groups:
                    out = policy.step(self._obs_of(agents), self.rnn.index_select(0, agents),
                                      deterministic=self.deterministic)
                    self._set_actions(agents, out.actions.numpy())
                    self.rnn.index_copy_(0, agents, out.rnn_state)
                rewards, terminated, truncated, infos = self.env.step_into(self.actions, self.obs)
                self.returns += rewards
                self.lengths += 1
                ended = terminated | truncated
                if ended.any():
                    self.rnn[torch.from_numpy(ended)] = 0.0
                    for agent in np.flatnonzero(ended & self.counted):
                        self._finish(agent, infos[agent].get("episode_true_return", math.nan),
                                     cut=False)
                    self.returns[ended] = 0.0
                    self.lengths[ended] = 0
                if (self.max_steps is not None and self.lengths.max() >= self.max_steps
                        and len(self.episodes) < wanted):
                    # Cut every agent's running episode: the env interface resets all at once.
                    for agent in np.flatnonzero((self.lengths > 0) & self.counted):
                        self._finish(agent, math.nan, cut=True)
                    self._restart(None)

    def _obs_of(self, agents: torch.Tensor) -> dict[str, torch.Tensor]:
        """The observations of ``agents`` (one policy's), a row each."""
        if self.heterogeneous:
            rows = [self.obs_t[a] for a in agents.tolist()]
            return {k: torch.stack([row[k] for row in rows]) for k in rows[0]}
        return {k: v.index_select(0, agents) for k, v in self.obs_t.items()}

    def _set_actions(self, agents: torch.Tensor, actions: np.ndarray) -> None:
        """Write the actions one policy chose for ``agents`` (a row each)."""
        if self.heterogeneous:
            for agent, row in zip(agents.tolist(), actions, strict=True):
                self.actions[agent][...] = row.reshape(self.actions[agent].shape)
            return
        self.actions[agents.numpy()] = actions.reshape(-1, *self.spec.action_shape)

    def _finish(self, agent: int, true_return: float, cut: bool) -> None:
        self.episodes.append(Episode(float(self.returns[agent]), int(self.lengths[agent]),
                                     float(true_return), cut))

    def _restart(self, seed: int | None) -> None:
        self.rnn.zero_()
        self.returns[:] = 0.0
        self.lengths[:] = 0
        self.env.reset_into(self.obs, seed=seed)
