"""Episodes played on many envs at once with one policy, each episode from a seed of its own.

``sfbus eval``'s loop. Every env episode starts from an explicit reset with the next seed of a
sequence (``first_seed``, ``first_seed + 1``, ...), so an episode's row is reproducible alone:
the same seed played on one env gives the same episode (deterministic actions; sampled ones come
from a generator seeded once for the whole evaluation). The envs are stepped one after another,
but the policy acts for all of them in one batched call per step: the cost of a step of the
network is paid once for every env, as the inference worker does for its rollout workers.

An env's episode ends when all of its agents' episodes ended on the same step (one match of a
multi-agent env); each agent gives one row. Agents of a multi-agent env whose episodes end at
different steps keep playing from the env's own reset until the last one ends. Each agent acts
with its own player (the same policy for all, or agent 0 the evaluated policy and the others a
fixed opponent, or in an env of heterogeneous agents each side its own policy); each distinct
player acts for its agents of every env in one batched call. An env of heterogeneous agents
(``EnvSpec.agent_specs``) keeps each agent's observations and actions in arrays of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sfbus_components.envs import MultiAgentEnv
from sfbus_components.envs.spec import AgentObs, ObsDict
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
    """Plays ``episodes`` env episodes on ``envs`` (of one spec), agent ``i`` of every env
    acting with ``players[i]``."""

    def __init__(self, envs: list[MultiAgentEnv], players: Sequence[Policy], state_size: int, *,
                 deterministic: bool, first_seed: int) -> None:
        self.envs = envs
        self.deterministic = deterministic
        spec = envs[0].spec
        self.agents = spec.num_agents
        by_player: dict[int, tuple[Policy, list[int]]] = {}
        for agent, player in enumerate(players):
            by_player.setdefault(id(player), (player, []))[1].append(agent)
        self.groups = list(by_player.values())
        """Each distinct player with the agents it acts for."""
        rows = len(envs) * self.agents
        self.heterogeneous = spec.heterogeneous
        if self.heterogeneous:  # per agent: its own fields and action shape, a row per env
            self.agent_obs = [{k: np.zeros((len(envs), *f.shape), f.dtype)
                               for k, f in s.observation_space.items()} for s in spec.agent_specs]
            self.agent_obs_t = [{k: torch.from_numpy(v) for k, v in o.items()}
                                for o in self.agent_obs]
            self.agent_actions = [np.zeros((len(envs), *s.action_shape), s.action_dtype)
                                  for s in spec.agent_specs]
        else:
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
                for player, agents in self.groups:
                    self._act(player, [(i, a) for i in playing for a in agents])
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

    def _act(self, policy: Policy, pairs: list[tuple[int, int]]) -> None:
        """``policy``'s actions and next states for the (env, agent) ``pairs``."""
        active = torch.tensor([env * self.agents + agent for env, agent in pairs])
        if self.heterogeneous:
            obs = {k: torch.stack([self.agent_obs_t[agent][k][env] for env, agent in pairs])
                   for k in self.agent_obs_t[pairs[0][1]]}
        else:
            obs = {k: v.index_select(0, active) for k, v in self.obs_t.items()}
        out = policy.step(obs, self.rnn.index_select(0, active),
                          deterministic=self.deterministic, generator=self.generator)
        if self.heterogeneous:
            for (env, agent), action in zip(pairs, out.actions.numpy(), strict=True):
                self.agent_actions[agent][env] = action.reshape(
                    self.agent_actions[agent].shape[1:])
        else:
            self.actions[active.numpy()] = out.actions.reshape(
                -1, *self.envs[0].spec.action_shape).numpy()
        self.rnn.index_copy_(0, active, out.rnn_state)

    def _env_obs(self, env: int) -> ObsDict | AgentObs:
        """Where env ``env`` writes its observations: its rows, or each agent's own row."""
        if self.heterogeneous:
            return [{k: v[env] for k, v in o.items()} for o in self.agent_obs]
        return {k: v[self._rows(env)] for k, v in self.obs.items()}

    def _start(self, env: int) -> None:
        """Reset env ``env`` with the next seed into its rows."""
        rows = self._rows(env)
        self.envs[env].reset_into(self._env_obs(env), seed=self.next_seed)
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
        actions = ([a[env] for a in self.agent_actions] if self.heterogeneous
                   else self.actions[rows])
        rewards, terminated, truncated, infos = self.envs[env].step_into(actions,
                                                                         self._env_obs(env))
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
