"""Episodes played on many envs at once with one policy, each episode from a seed of its own.

``sfbus eval``'s loop. Every env episode starts from an explicit reset with the next seed of a
sequence (``first_seed``, ``first_seed + 1``, ...), so an episode's row is reproducible alone:
the same seed played on one env gives the same episode (deterministic actions; sampled ones come
from a generator seeded once for the whole evaluation). The envs are stepped one after another,
but the policy acts for all of them in one batched call per step: the cost of a step of the
network is paid once for every env, as the inference worker does for its rollout workers.

An env's episode ends when all of its agents' episodes ended on the same step (one match of a
multi-agent env); each agent gives one row. Agents of a multi-agent env whose episodes end at
different steps keep playing from the env's own reset until the last one ends. With an
``opponent``, agent 0 of every env plays the policy and every other agent the opponent (a fixed
one: a league snapshot or another checkpoint), in a batched call of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sfbus_components.envs import MultiAgentEnv
from sfbus_components.models.policy import Policy


@dataclass(frozen=True)
class SeededEpisode:
    """One agent's episode of an env episode started from ``seed``."""

    seed: int
    agent: int
    episode_return: float
    true_return: float
    """The env's unshaped score (NaN where the env does not shape its reward)."""
    length: int
    """Env steps."""
    win: float = math.nan
    """The match's outcome the env reported (``episode_win``: 1, 0.5 a draw, 0; NaN: none)."""


class SeededEpisodes:
    """Plays ``episodes`` env episodes on ``envs`` (of one spec) with ``policy``."""

    def __init__(self, envs: list[MultiAgentEnv], policy: Policy, state_size: int, *,
                 deterministic: bool, first_seed: int, opponent: Policy | None = None) -> None:
        self.envs = envs
        self.policy = policy
        self.opponent = opponent
        """Plays every agent but agent 0 (None: the policy plays them all)."""
        self.deterministic = deterministic
        spec = envs[0].spec
        self.agents = spec.num_agents
        rows = len(envs) * self.agents
        self.obs = {k: np.zeros((rows, *f.shape), f.dtype)
                    for k, f in spec.observation_space.items()}
        self.obs_t = {k: torch.from_numpy(v) for k, v in self.obs.items()}
        self.actions = np.zeros((rows, *spec.action_shape), spec.action_dtype)
        self.rnn = torch.zeros(rows, state_size)
        self.returns = np.zeros(rows)
        self.lengths = np.zeros(rows, np.int64)
        self.ended = np.zeros(rows, bool)
        self.true_returns = np.full(rows, math.nan)
        self.wins = np.full(rows, math.nan)
        self.seeds = [0] * len(envs)
        self.next_seed = first_seed
        self.generator = torch.Generator().manual_seed(first_seed)

    def play(self, episodes: int,
             on_episode: Callable[[list[SeededEpisode]], None] | None = None,
             ) -> list[SeededEpisode]:
        """Play until ``episodes`` env episodes ended; their rows sorted by seed and agent.
        ``on_episode`` is called with the rows of each env episode as it ends."""
        stop_seed = self.next_seed + episodes
        playing = list(range(min(len(self.envs), episodes)))
        for env in playing:
            self._start(env)
        rows: list[SeededEpisode] = []
        with torch.inference_mode():
            while playing:
                active = torch.tensor([i * self.agents + a for i in playing
                                       for a in range(self.agents)])
                if self.opponent is None:
                    self._act(self.policy, active)
                else:
                    first = active % self.agents == 0
                    self._act(self.policy, active[first])
                    self._act(self.opponent, active[~first])
                still = []
                for i in playing:
                    finished = self._step(i)
                    if finished:
                        rows.extend(finished)
                        if on_episode is not None:
                            on_episode(finished)
                        if self.next_seed >= stop_seed:
                            continue  # this env's work is done
                        self._start(i)
                    still.append(i)
                playing = still
        return sorted(rows, key=lambda e: (e.seed, e.agent))

    def _act(self, policy: Policy, active: torch.Tensor) -> None:
        """``policy``'s actions and next states for the rows ``active``."""
        obs = {k: v.index_select(0, active) for k, v in self.obs_t.items()}
        out = policy.step(obs, self.rnn.index_select(0, active),
                          deterministic=self.deterministic, generator=self.generator)
        self.actions[active.numpy()] = out.actions.reshape(
            -1, *self.envs[0].spec.action_shape).numpy()
        self.rnn.index_copy_(0, active, out.rnn_state)

    def _start(self, env: int) -> None:
        """Reset env ``env`` with the next seed into its rows."""
        rows = self._rows(env)
        self.envs[env].reset_into({k: v[rows] for k, v in self.obs.items()}, seed=self.next_seed)
        self.seeds[env] = self.next_seed
        self.next_seed += 1
        self.rnn[rows] = 0.0
        self.returns[rows] = 0.0
        self.lengths[rows] = 0
        self.ended[rows] = False
        self.true_returns[rows] = math.nan
        self.wins[rows] = math.nan

    def _step(self, env: int) -> list[SeededEpisode]:
        """Step env ``env``; the rows of its episode if every agent's has now ended."""
        rows = self._rows(env)
        rewards, terminated, truncated, infos = self.envs[env].step_into(
            self.actions[rows], {k: v[rows] for k, v in self.obs.items()})
        playing = ~self.ended[rows]  # an agent already done plays on unrecorded
        self.returns[rows] += rewards * playing
        self.lengths[rows] += playing
        done = (terminated | truncated) & playing
        self.rnn[rows][torch.from_numpy(terminated | truncated)] = 0.0
        for agent in np.flatnonzero(done):
            self.true_returns[rows.start + agent] = infos[agent].get("episode_true_return",
                                                                     math.nan)
            self.wins[rows.start + agent] = infos[agent].get("episode_win", math.nan)
        self.ended[rows] |= done
        if not self.ended[rows].all():
            return []
        return [SeededEpisode(self.seeds[env], a, float(self.returns[rows.start + a]),
                              float(self.true_returns[rows.start + a]),
                              int(self.lengths[rows.start + a]), float(self.wins[rows.start + a]))
                for a in range(self.agents)]

    def _rows(self, env: int) -> slice:
        return slice(env * self.agents, (env + 1) * self.agents)
