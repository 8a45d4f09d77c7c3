"""Heterogeneous agents (``agent_policies``): a split whose agents act with policies of different
observation and action spaces, each policy's agents fixed for the run.

The worker's buffer keeps one slot pool, request table and the fields every agent shares (RNN
state, rewards, dones, ...); each policy has its own observation and action arrays
(:mod:`sfbus_components.datapath.buffers`). A :class:`HeterogeneousSplit` groups its rows by
policy: it gathers each policy's actions from that policy's arrays into a staging array, steps
its envs with one action array per agent (views of the staging) and writes each agent's
observation into its policy's scratch (views too), scattered to the slots once per step. It asks
for actions as the population split does, one request per policy, and the inference worker reads
and writes each policy's rows in that policy's arrays. The policy of every agent comes from
:class:`FixedAgentMapping`, so no agent ever changes policy (or space).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sfbus_components.datapath.buffers import TrajectoryBuffer
from sfbus_components.envs.spec import AgentObs
from sfbus_components.sampling.policy_mapping import AgentPolicies
from sfbus_components.sampling.splits import PopulationSplit, SplitWiring


class FixedAgentMapping:
    """The policy of each of an env's agents, the same in every env and episode (the run's
    ``agent_policies``, resolved by name in the data-path record)."""

    def __init__(self, agent_policies: tuple[int, ...]) -> None:
        self.agent_policies = agent_policies

    def assign(self, env_index: int, agent_index: int, episode: int) -> int:
        """The policy agent ``agent_index`` acts with in every env and episode."""
        return self.agent_policies[agent_index]


class _PolicyRows:
    """The rows of one split that one policy acts for, with that policy's view of the buffer
    and the staging its agents' actions and observations pass through."""

    def __init__(self, buffer: TrajectoryBuffer, index: np.ndarray) -> None:
        spec = buffer.layout.spec
        n = len(index)
        self.index = index
        """The rows' places in the split (split-local row numbers)."""
        self.slots = np.zeros(n, np.int64)
        """The rows' slots, refreshed at every start."""
        self.obs_items = tuple(buffer.obs_numpy().items())
        self.actions = buffer.numpy["actions"]
        self.staging = np.zeros((n, *spec.action_shape), spec.action_dtype)
        self.scratch = {k: np.zeros((n, *f.shape), f.dtype)
                        for k, f in spec.observation_space.items()}
        self.carry = {k: np.zeros_like(v) for k, v in self.scratch.items()}


class HeterogeneousSplit(PopulationSplit):
    """Rows acting with policies of different spaces: one set of arrays per policy."""

    def __init__(self, index: int, wiring: SplitWiring, population: AgentPolicies) -> None:
        super().__init__(index, wiring, population)
        layout = wiring.buffer.layout
        self.groups = [_PolicyRows(wiring.buffer.of_policy(p), index)
                       for p in range(len(layout.policy_specs))
                       if len(index := np.flatnonzero(self.policies == p))]
        rows = self.rows
        actions: list[Any] = [None] * rows
        outs: list[Any] = [None] * rows
        carry: list[Any] = [None] * rows
        for g in self.groups:
            for j, row in enumerate(g.index.tolist()):
                actions[row] = g.staging[j]
                outs[row] = {k: v[j] for k, v in g.scratch.items()}
                carry[row] = {k: v[j] for k, v in g.carry.items()}
        na = self.num_agents
        self.agent_actions = actions
        """Each row's action, a view of its policy's staging (an env takes its agents' slice)."""
        self.agent_outs: list[AgentObs] = [outs[a:a + na] for a in range(0, rows, na)]
        """Each env's agents' observation dicts, views of their policies' scratch."""
        self.carry_outs: list[AgentObs] = [carry[a:a + na] for a in range(0, rows, na)]

    def reset_outs(self) -> list[Any]:
        """Each env's agents' rows of their policies' carry."""
        return self.carry_outs

    def start(self, fresh: np.ndarray) -> None:
        """Fill ``fresh`` from step 0: the shared fields as any split, each policy's
        observations from its own carry; every step acted on by its row's fixed policy."""
        super().start(fresh)
        for g in self.groups:
            g.slots[:] = self.slots[g.index]
            for k, arr in g.obs_items:
                arr[g.slots, 0] = g.carry[k]
        self._fill_policy()

    def _stage_carry(self) -> None:
        super()._stage_carry()
        for g in self.groups:
            for k, arr in g.obs_items:
                g.carry[k][:] = arr[g.slots, self.rollout]

    def step(self) -> None:
        """Step every env with its agents' actions from their policies' arrays; observations
        go to their policies' arrays at t+1."""
        t = self.t
        t1 = t + 1
        slots = self.slots
        rewards, dones, time_outs = self.step_rewards, self.step_dones, self.step_time_outs
        for g in self.groups:
            g.staging[:] = g.actions[g.slots, t]
        ended = self.vector.step_into(self.agent_actions, self.agent_outs, rewards, dones,
                                      time_outs)
        for g in self.groups:
            for k, arr in g.obs_items:
                arr[g.slots, t1] = g.scratch[k]
        self.rewards[slots, t] = rewards
        self.dones[slots, t] = dones
        self.time_outs[slots, t] = time_outs
        if ended:
            self._ended(ended, t1)
        self.t = t1
        self.population.count_frames(self.index, self.frameskip)
        if self.population.ended:
            self.population.switch()  # counts the agents' episodes; a fixed mapping moves none
