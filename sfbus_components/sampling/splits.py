"""A split of a rollout worker's envs, and the sampling modes as its subclasses (strategies).

A worker's envs are stepped in ``num_splits`` groups (double-buffered sampling); a :class:`Split`
is one group: its agent rows, the slot each row fills (a view of the worker's ``row_slots``), the
step ``t`` they are at, and its envs as one :class:`sfbus_components.envs.vector.VectorEnvs`. How a
split places its rows in the trajectory buffer and asks for actions is the sampling mode, a subclass
built once when the worker starts, so the hot path has no mode tests:

- :class:`NonBatchedSplit` (``sampling: non_batched``, one policy): rows fill slots anywhere in
  the ``[slot, t]`` layout; a request names rows of the request table, which the inference worker
  gathers.
- :class:`PopulationSplit` (``num_policies`` > 1): the same, with one request per policy acting
  in the split and the policy of every step recorded
  (see :mod:`sfbus_components.sampling.policy_mapping`).
- :class:`sfbus_components.sampling.batched_layout.BatchedSplit` (``sampling: batched``): rows fill
one   contiguous block, served as a slice.

The worker drives a split through ``take_slots`` / ``start`` (fresh slots, carrying over the last
observation and state), then ``request`` / ``step`` in turn until ``t`` reaches T, then ``finish``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sfbus import SlotPool
from sfbus_components.datapath.buffers import TrajectoryBuffer
from sfbus_components.datapath.messages import EpisodeFinished, InferenceRequest
from sfbus_components.envs.spec import ObsDict
from sfbus_components.envs.vector import Ended, VectorEnvs
from sfbus_components.sampling.extra_stats import episode_extra_stats
from sfbus_components.sampling.policy_mapping import AgentPolicies
from sfbus_components.sampling.worker_envs import WorkerEnvs


class Emit(Protocol):
    """A bound signal's ``emit``."""

    def __call__(self, payload: Any, *, key: int | None = None) -> None:
        """Send ``payload`` (to the replica ``key`` picks on an ``any`` link)."""


@dataclass(frozen=True)
class SplitWiring:
    """What the splits of one worker share."""

    worker: int
    """The worker's index (its replica number)."""
    policy: int
    """The policy acting for every agent when there is one policy."""
    buffer: TrajectoryBuffer
    row_slots: np.ndarray
    """The slot each agent row fills; each split holds a view of its rows."""
    agent_policy: np.ndarray
    """The policy each agent row acts with; each split holds a view of its rows."""
    envs: WorkerEnvs
    request: Emit
    """Emits an ``InferenceRequest``."""
    episode: Callable[[EpisodeFinished], None]
    """Reports a finished episode."""


class Split:
    """Split ``index`` of a worker; subclasses say how it steps and asks for actions."""

    def __init__(self, index: int, wiring: SplitWiring) -> None:
        layout = wiring.buffer.layout
        self.index = index
        self.rows = rows = layout.rows_per_split
        self.first_row = lo = index * rows
        self.num_agents = na = layout.spec.num_agents
        self.rollout = layout.rollout
        self.worker = wiring.worker
        self.policy = wiring.policy
        self.buffer = wiring.buffer
        self.emit = wiring.request
        self.episode = wiring.episode
        self.slots = wiring.row_slots[lo:lo + rows]
        """The slot of each row (while paused: the slot it just filled)."""
        self.policies = wiring.agent_policy[lo:lo + rows]
        """The policy of each row."""
        self.at_rows: np.ndarray | slice = self.slots
        """The rows as ``TrajectoryBuffer.at`` takes them."""
        envs = rows // na
        self.worker_envs = wiring.envs
        self.vector = VectorEnvs(wiring.envs.envs, index * envs, envs, na, wiring.envs.recreate)
        self.t = 0
        """The step every row is at."""
        self.awaiting = 0
        """Requests of the split still unanswered."""
        fields = self.buffer.numpy
        # The observation fields by key, as a tuple: the per-step loops run over it.
        self.obs_items = tuple(self.buffer.obs_numpy().items())
        self.rnn = fields["rnn"]
        # None in a heterogeneous worker's view: each policy has its own (HeterogeneousSplit)
        self.actions = fields.get("actions")
        self.rewards, self.dones = fields["rewards"], fields["dones"]
        self.time_outs = fields["time_outs"]
        self.step_policies = fields["policies"]
        self.inactive = fields["inactive"]
        # Preallocated staging: one write per field and step, no allocation.
        self.step_rewards = np.zeros(rows, np.float32)
        self.step_dones = np.zeros(rows, bool)
        self.step_time_outs = np.zeros(rows, bool)
        # The carried observation and state are staged here: once this split's slots are
        # released, another split may reuse and overwrite them before this one resumes.
        self.carry_obs = {k: np.zeros((rows, *f.shape), f.dtype)
                          for k, f in layout.spec.observation_space.items()
                          if k in self.buffer.obs_keys}
        self.carry_rnn = np.zeros((rows, self.rnn.shape[-1]), np.float32)

    def reset_outs(self) -> list[Any]:
        """Where each of the split's envs writes its first observation (its rows of the carry):
        the worker creates and resets them into these."""
        return self.vector.rows_of(self.carry_obs)

    def make_batch(self) -> bool:
        """Make the split's envs as one native batch (batched sampling only): False when they
        are to be made one by one into ``vector``."""
        return False

    def step(self) -> None:
        """Step every env with the actions at ``t``, write what followed; ``t`` moves on."""
        raise NotImplementedError

    def request(self, seq: int) -> None:
        """Emit the request(s) for the actions at ``t``, numbered ``seq``; set ``awaiting``."""
        raise NotImplementedError

    def take_slots(self, pool: SlotPool) -> np.ndarray | None:
        """Fresh slots for the split's rows from ``pool``, or None while too few are free."""
        if pool.free < self.rows:
            return None
        return np.array(pool.acquire_many(self.rows), np.int64)

    def start(self, fresh: np.ndarray) -> None:
        """Fill the ``fresh`` slots from step 0, which holds the carried observation and state."""
        self.slots[:] = fresh
        at = self.buffer.at(self.at_rows, 0)
        for k, arr in self.obs_items:
            arr[at] = self.carry_obs[k]
        self.rnn[at] = self.carry_rnn
        # every step active until an agent's info says otherwise (`_ended`)
        self.inactive[self.buffer.at(self.at_rows, slice(None))] = 0
        self.t = 0

    def finish(self) -> list[int]:
        """Stage the carry from the full slots; return the policy each slot goes to."""
        self._stage_carry()
        return self.policies.tolist()

    def _stage_carry(self) -> None:
        at = self.buffer.at(self.at_rows, self.rollout)
        for k, arr in self.obs_items:
            self.carry_obs[k][:] = arr[at]
        self.carry_rnn[:] = self.rnn[at]

    def _fill_policy(self) -> None:
        """Record each row's policy at every step of its slot (one policy acts in a slot)."""
        self.step_policies[self.buffer.at(self.at_rows, slice(None))] = self.policies[:, None]

    def _ended(self, ended: Ended, t1: int) -> None:
        """Report the episodes of the envs that are done; zero their rows' state at ``t1``;
        mark the step of an agent whose info says it did not act (``is_active`` False) inactive.
        (A multi-agent env reports an inactive agent as terminated, so its env is here.)"""
        for a, infos in ended:
            self._report(a, infos)
            for j, info in enumerate(infos):
                if not info.get("is_active", True):
                    self.inactive[self.buffer.at(self.slots[a + j:a + j + 1], t1 - 1)] = 1
        # forward_step never resets state: a new episode starts from zeros, overwriting the
        # state the inference worker already wrote at t+1.
        self.rnn[self.buffer.at(self.slots[self.step_dones], t1)] = 0.0

    def _report(self, a: int, infos: list[dict[str, Any]]) -> None:
        """Report the episodes that the agents of an env (rows from ``a``) finished."""
        policies = self.policies
        for j, info in enumerate(infos):
            if "episode_return" in info:
                other = info.get("episode_opponent")  # the opponent's agent index in this env
                self.episode(EpisodeFinished(
                    int(policies[a + j]), float(info["episode_return"]),
                    int(info["episode_length"]), int(info["episode_frames"]),
                    float(info.get("episode_true_return", math.nan)),
                    float(info.get("episode_win", math.nan)),
                    -1 if other is None else int(policies[a + other]),
                    episode_extra_stats(info),
                    (-1, -1) if other is None else self._versions_of(a + other)))

    def _versions_of(self, row: int) -> tuple[int, int]:
        """Agent ``row``'s weights versions at its episode's first step and at this step (not
        tracked here: one policy, no league)."""
        return -1, -1


class TableSplit(Split):
    """Rows in slots anywhere in the ``[slot, t]`` layout, named to inference by the request
    table (its slot column written at ``start``, its step column per request)."""

    def __init__(self, index: int, wiring: SplitWiring) -> None:
        super().__init__(index, wiring)
        if self.buffer.layout.block_rows:
            raise ValueError("a table split needs the [slot, t] layout (sampling: non_batched)")
        self.table = self.buffer.requests[index]
        """The split's request-table rows: (slot, t) per row."""
        # A multi-agent env's agents fill scattered slots: it writes a split-wide scratch,
        # scattered to the slots once per step. A single agent writes its slot's row in place.
        self.scratch = ({k: np.zeros_like(v) for k, v in self.carry_obs.items()}
                        if self.num_agents > 1 else {})
        self.scratch_outs = self.vector.rows_of(self.scratch) if self.scratch else []

    def step(self) -> None:
        """Step every env with the actions at ``t``; observations go to their slots at t+1."""
        t = self.t
        t1 = t + 1
        slots = self.slots
        rewards, dones, time_outs = self.step_rewards, self.step_dones, self.step_time_outs
        # The [slot, t] layout: TrajectoryBuffer.at(slots, t) is (slots, t) itself.
        actions = self.actions[slots, t]  # one gather for the whole split
        ended = self.vector.step_into(actions, self.scratch_outs or self._slot_rows(t1),
                                      rewards, dones, time_outs)
        if self.scratch:
            for k, arr in self.obs_items:
                arr[slots, t1] = self.scratch[k]
        self.rewards[slots, t] = rewards
        self.dones[slots, t] = dones
        self.time_outs[slots, t] = time_outs
        if ended:
            self._ended(ended, t1)
        self.t = t1

    def _slot_rows(self, t: int) -> list[ObsDict]:
        """Each single-agent env's destination: its slot's row at step ``t`` (views)."""
        outs = []
        for row in self.slots.tolist():
            out = {}
            for k, arr in self.obs_items:  # a loop: in Python 3.11 a comprehension is a call
                out[k] = arr[row:row + 1, t]
            outs.append(out)
        return outs

    def start(self, fresh: np.ndarray) -> None:
        """Fill ``fresh`` from step 0; the table names them until the next ``start``."""
        super().start(fresh)
        self.table[:, 0] = fresh


class NonBatchedSplit(TableSplit):
    """``sampling: non_batched`` with one policy: one request per step for the whole split."""

    def request(self, seq: int) -> None:
        """Emit one request for every row of the split."""
        self.table[:, 1] = self.t
        self.awaiting = 1
        self.emit(InferenceRequest(self.worker, self.index, self.rows, self.policy, seq=seq))

    def start(self, fresh: np.ndarray) -> None:
        """Fill ``fresh`` from step 0, every step acted on by the worker's policy."""
        super().start(fresh)
        self._fill_policy()


class PopulationSplit(TableSplit):
    """``num_policies`` > 1: a policy per agent and episode, one request per policy acting."""

    def __init__(self, index: int, wiring: SplitWiring, population: AgentPolicies) -> None:
        super().__init__(index, wiring)
        self.population = population
        self.row_slots = wiring.row_slots
        self.apply_shaping = wiring.envs.apply_shaping
        self.frameskip = self.buffer.layout.spec.frameskip
        self.versions = self.buffer.numpy.get("versions")  # None: a heterogeneous worker's view
        self.first_versions = np.full(self.rows, -1, np.int64)
        """Each row's weights version at its episode's first step (-1: not acted yet)."""

    def step(self) -> None:
        """Step, then record who acted at ``t``; agents whose episode ended switch policy."""
        t = self.t
        if self.versions is not None and (fresh := self.first_versions < 0).any():
            self.first_versions[fresh] = self.versions[self.slots[fresh], t]
        super().step()
        self.step_policies[self.slots, t] = self.policies
        self.population.count_frames(self.index, self.frameskip)
        # After recording who acted at t: the next episodes' policies act from t + 1.
        if self.population.ended:
            na = self.num_agents
            for row in self.population.switch():
                if row % na == 0:
                    self.apply_shaping(row // na)

    def request(self, seq: int) -> None:
        """Emit one request per policy acting in the split, keyed by policy (with several
        inference replicas each serves a fixed subset); its rows contiguous in the table."""
        groups = self.population.groups(self.index)
        self.table[:, 0] = self.row_slots[groups.rows]
        self.table[:, 1] = self.t
        self.awaiting = len(groups.groups)
        for policy, offset, count in groups.groups:
            self.emit(InferenceRequest(self.worker, self.index, count, policy, offset, seq),
                      key=policy)

    def finish(self) -> list[int]:
        """Stage the carry; a slot where an agent switched policy goes to its majority policy."""
        self._stage_carry()
        return self.population.owners(self.index,
                                      self.step_policies[self.slots, :self.rollout])

    def _report(self, a: int, infos: list[dict[str, Any]]) -> None:
        """Report the episodes; their agents pick their next policy after this step."""
        super()._report(a, infos)
        for j, info in enumerate(infos):
            if "episode_return" in info:
                self.population.ended.append(self.first_row + a + j)
                self.first_versions[a + j] = -1

    def _versions_of(self, row: int) -> tuple[int, int]:
        """Agent ``row``'s weights versions at its episode's first step and at this step."""
        if self.versions is None:
            return -1, -1
        return int(self.first_versions[row]), int(self.versions[self.slots[row], self.t])
