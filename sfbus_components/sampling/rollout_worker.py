"""The rollout worker: steps its envs split by split, writing trajectories into shared memory.

A worker owns ``num_envs`` envs in ``num_splits`` groups (double-buffered sampling, Figure 2 of
the paper): while the inference worker computes actions for one split, the worker steps the other.
Agent ``a`` of env ``e`` is row ``e * num_agents + a``; split ``s`` holds the contiguous rows of
envs ``[s * envs_per_split, (s + 1) * envs_per_split)``. Every row fills its own trajectory slot,
and every split advances its rows' step ``t`` together (see :mod:`sfbus_components.datapath.buffers`
for what lives at ``[slot, t]``). Observations go straight from the env into the shared buffer.

When a split's slots hold T steps it emits ``trajectory_ready`` per slot and takes fresh slots
from the worker's pool, carrying the last observation and RNN state to step 0. An empty pool
pauses that split until ``slots_released`` brings slots back: that is async mode's back-pressure
and sync mode's pause while the learner trains.

With ``num_policies`` > 1 every agent gets a policy at each episode start from the mapping, a
split sends one request per policy acting in it, and a slot goes to the policy that acted for most
of its steps (see :mod:`sfbus_components.sampling.policy_mapping`). A league's opponent slots
(``opponent_slots``, :mod:`sfbus_components.league`) act the same way, but a slot they own goes
straight back to the pool: their steps are never trained on. With ``agent_policies``
(heterogeneous agents) every agent's policy is fixed by name for the run and the splits keep each
policy's observations and actions in its own arrays
(:mod:`sfbus_components.sampling.heterogeneous_split`). PBT's reward-shaping
coefficients arrive as ``HyperparamsChanged`` and are applied to the envs whose agents act with that
policy.

The worker is the actor around three objects it owns: its splits, built once in the class of the
sampling mode (non-batched, population, batched: :mod:`sfbus_components.sampling.splits`), which
step their envs into the buffer and ask for actions; its envs
(:mod:`sfbus_components.sampling.worker_envs`: creation, recreation after a fault, PBT's shaping);
and its fault handling (:mod:`sfbus_components.sampling.rollout_faults`: slot stages, request
numbers, batcher restarts).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import numpy as np

from sfbus import ArraySpec, RateLimitedLog, RunRecords, Signal, Topology, slot
from sfbus_components.datapath.buffers import TrajectoryBuffer, pool_name
from sfbus_components.datapath.messages import (
    ActionsReady,
    BatcherStarted,
    EpisodeFinished,
    HyperparamsChanged,
    InferenceRequest,
    RolloutProgress,
    SlotsReleased,
    TrajectoryReady,
)
from sfbus_components.datapath.record import DataPath, TrajectoryWriter
from sfbus_components.sampling.batched_layout import BatchedSplit
from sfbus_components.sampling.heterogeneous_split import FixedAgentMapping, HeterogeneousSplit
from sfbus_components.sampling.policy_mapping import AgentPolicies, load_mapping
from sfbus_components.sampling.rollout_faults import RolloutFaults
from sfbus_components.sampling.rollout_params import RolloutParams
from sfbus_components.sampling.splits import NonBatchedSplit, PopulationSplit, Split, SplitWiring
from sfbus_components.sampling.worker_envs import WorkerEnvs

_WAIT_BUCKETS = (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2, 0.25, 1.0)
"""Seconds from a split's request to its actions: a GPU pass takes a fraction of a millisecond,
a CPU pass a few, a stalled inference worker up to the request timeout."""


class RolloutWorker(TrajectoryWriter):
    """Steps ``num_envs`` envs in ``num_splits`` splits with actions from the inference workers."""

    component = "rollout"
    Params = RolloutParams
    records = (DataPath,)
    _frozen_from: int | None = None
    """The first policy id of a league's opponent slots (None: the run has none)."""

    inference_requested = Signal(InferenceRequest, "a split's rows await actions")
    trajectory_ready = Signal(TrajectoryReady, "a slot holds T steps")
    episode_finished = Signal(EpisodeFinished, "an agent finished an episode")
    rollout_progress = Signal(RolloutProgress, "env frames since the last report")

    @classmethod
    def shared_arrays(cls, name: str, params: RolloutParams, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """The worker's trajectory buffer, request table and slot pool; the policy mapping is
        built once here, so that a bad one is an error before anything starts."""
        if params.acting_policies > 1:
            load_mapping(params.policy_mapping, params.num_policies, 0, params.seed,
                         params.opponent_slots, params.policy_mapping_params)
        return records[DataPath].layout.array_specs(name)

    async def on_start(self) -> None:
        """Create and reset the envs, take one slot per agent, request every split's actions."""
        try:
            import cv2
        except ImportError:  # no doom envs in this install; nothing else uses cv2
            pass
        else:
            cv2.setNumThreads(1)  # one core per worker: cv2's thread pool only adds contention
        p = self.params
        self.worker = self.context.replica
        layout = self.context.records[DataPath].layout
        self.spec = layout.spec
        self.buffer = TrajectoryBuffer(self.context, self.name, layout)
        self.pool = self.context.slot_pool(pool_name(self.name), owner=self.name, actor=self.name)
        self._rl_log = RateLimitedLog(self.log)
        self.num_agents = na = self.spec.num_agents
        self.rollout = p.rollout
        self.rows_per_split = layout.rows_per_split
        agents = p.num_envs * na
        # Per-agent policy id; with a population the mapping rewrites entries at episode starts.
        self.population: AgentPolicies | None = None
        self.agent_policy = np.full(agents, p.policy, np.int64)
        if layout.agent_policies:  # each agent's policy fixed by name for the run
            self.population = AgentPolicies(FixedAgentMapping(layout.agent_policies),
                                            p.num_policies, p.num_envs, na, p.num_splits)
            self.agent_policy = self.population.policy
        elif p.acting_policies > 1:
            self.population = self._mapped_policies(na)
            self.agent_policy = self.population.policy
        # Current slot of every agent row (while its split is paused: the slot it just filled).
        self.row_slots = np.zeros(agents, np.int64)
        # Splits that filled their slots and wait for free ones, first come first served.
        self.paused: deque[int] = deque()
        self.frames_since_report = 0
        self._frames_per_split_step = self.rows_per_split * self.spec.frameskip
        self._failures_reported = 0
        self._create_metrics()

        # Reclaims what a previous incarnation of this worker left taken.
        self.faults = RolloutFaults(self.context, self.name, self.pool, p.num_splits, self.log)
        self.envs = WorkerEnvs(p, self.name, self.worker, self.faults.restart_salt, na,
                               self.agent_policy, self.log, self.fail_process)
        wiring = SplitWiring(self.worker, p.policy, self.buffer, self.row_slots,
                             self.agent_policy, self.envs, self.inference_requested.emit,
                             self._episode_finished)
        # The sampling mode, chosen once: the hot path calls the splits' methods, never asks.
        self.splits: list[Split]
        if p.sampling == "batched":
            self.splits = [BatchedSplit(s, wiring) for s in range(p.num_splits)]
        elif self.population is not None:
            population_split = HeterogeneousSplit if layout.policy_specs else PopulationSplit
            self.splits = [population_split(s, wiring, self.population)
                           for s in range(p.num_splits)]
        else:
            self.splits = [NonBatchedSplit(s, wiring) for s in range(p.num_splits)]
        # Reset into the carry: every split starts like one resuming from a pause, so that a
        # restarted worker waits for slots the batcher still holds instead of failing.
        # Under batched sampling an env with a native batch (EnvPool) is made per split.
        self.envs.create([out for split in self.splits if not split.make_batch()
                          for out in split.reset_outs()])
        if p.decorrelate_envs_on_one_worker and self.envs.batches:
            self.log.warning("%s: decorrelate_envs_on_one_worker skips the envs of a native "
                             "batch (%s steps them all at once)", self.name, p.env)
        # decorrelate_experience_max_seconds: the wait after the first full trajectories
        workers = len(self.context.records[DataPath].workers)
        self._first_wait_s = p.decorrelate_experience_max_seconds * self.worker / workers
        self._holding = False
        self.paused.extend(range(p.num_splits))
        self._stepped_at = time.perf_counter()  # idle from here until the first actions
        self._paused_at = [self._stepped_at] * p.num_splits
        self._resume_paused()  # takes each split's slots and requests its actions
        self._m_free.set(self.pool.free)
        self.every(p.progress_interval_s, self._report_progress)
        self.every(p.inference_timeout_s, self._check_faults)

    def _create_metrics(self) -> None:
        """The worker's Prometheus series, and the clocks its waits are measured with."""
        self._m_frames = self.metrics.counter("env_frames", "Env frames collected (frameskip "
                                              "counted)")
        self._m_episodes = self.metrics.counter("episodes", "Episodes finished by agents")
        self._m_failures = self.metrics.counter("env_failures",
                                                "Envs recreated after an EnvError")
        self._m_free = self.metrics.gauge("free_slots", "Free trajectory slots in the pool")
        # Where a sampler loses time: the round trip of its requests, and the time it stepped no
        # split (every split waiting for its actions, from a pass of an inference worker in its
        # own process or another, or for free slots).
        self._m_actions_wait = self.metrics.histogram(
            "actions_wait_seconds", "a split's request sent to its actions arriving",
            _WAIT_BUCKETS)
        self._m_idle = self.metrics.counter("idle_seconds", "Time no split was stepping (all "
                                            "waiting for actions or free slots)")
        self._m_paused = self.metrics.counter("paused_seconds", "Split-seconds spent waiting "
                                              "for free slots (the learner's back-pressure; "
                                              "at the start, decorrelation's hold)")
        self._requested_at = [0.0] * self.params.num_splits
        self._idle_s = self._paused_s = 0.0

    def _mapped_policies(self, num_agents: int) -> AgentPolicies:
        """The agents' policies, assigned by the mapping (more than one policy acts)."""
        p = self.params
        mapping = load_mapping(p.policy_mapping, p.num_policies, self.worker, p.seed,
                               p.opponent_slots, p.policy_mapping_params)
        # A league's opponent slots (ids from here on) are never trained: their slots go back.
        self._frozen_from = p.num_policies if p.opponent_slots else None
        return AgentPolicies(mapping, p.acting_policies, p.num_envs, num_agents, p.num_splits)

    async def on_stop(self) -> None:
        """Report the frames stepped since the last report (the run's last progress record
        waits for them), log the slot audit, close every env and stop their watchdog."""
        self._report_progress(final=True)
        if hasattr(self, "splits"):
            self.faults.audit([split.slots for split in self.splits
                               if split.index not in self.paused])
        if hasattr(self, "envs"):
            self.envs.close()

    @slot
    def on_actions_ready(self, msg: ActionsReady) -> None:
        """Step the split whose actions the inference worker wrote, then request its next ones."""
        s = msg.split
        if (msg.worker != self.worker or not 0 <= s < len(self.splits)
                or not self.splits[s].awaiting
                or self.faults.stale(s, msg.seq)):  # stale: answers a request sent again since
            self._rl_log.warning("stray-actions", "%s: ignored unexpected %r (worker %d)",
                                 self.name, msg, self.worker)
            return
        split = self.splits[s]
        split.awaiting -= 1
        if not split.awaiting:  # every policy group of the split has its actions
            now = time.perf_counter()
            self._m_actions_wait.observe(now - self._requested_at[s])
            self._idle_s += now - self._stepped_at
            self._step_split(split)
            self._stepped_at = time.perf_counter()

    @slot
    def on_slots_released(self, msg: SlotsReleased) -> None:
        """Take the slots back and resume the splits that wait for them."""
        if msg.worker != self.worker:
            self._rl_log.warning("stray-release", "%s: ignored %r (worker %d)", self.name, msg,
                                 self.worker)
            return
        if self.faults.stages.release(msg.slots):  # stale: slots it took back after a restart
            self._rl_log.warning("stale-release", "%s: ignored a release of slots it no longer "
                                 "has downstream: %s", self.name, msg.slots)
        self._slots_back()

    @slot
    def on_batcher_started(self, msg: BatcherStarted) -> None:
        """A batcher (re)started: take back the slots an older one held."""
        if self.faults.batcher_started(msg.policy, msg.epoch):
            self._slots_back()

    @slot
    def on_hyperparams_changed(self, msg: HyperparamsChanged) -> None:
        """Take a policy's reward-shaping coefficients; apply them to the envs it acts in."""
        shaping = {name.removeprefix("reward_shaping."): value
                   for name, value in zip(msg.names, msg.values, strict=True)
                   if name.startswith("reward_shaping.")}
        if shaping:
            self.envs.set_shaping(msg.policy, shaping)

    # ----- the hot path ----------------------------------------------------------------------

    def _step_split(self, split: Split) -> None:
        """Step ``split`` (its sampling mode's work), then hand over its slots or ask again."""
        split.step()
        frames = self._frames_per_split_step
        self.report_progress(frames)
        self.frames_since_report += frames
        if split.t == self.rollout:
            self._finish_trajectories(split)
        else:
            self._request(split)

    def _request(self, split: Split) -> None:
        """Ask for the split's actions, sent at once so the next split steps meanwhile."""
        split.request(self.faults.next_seq(split.index))
        self._requested_at[split.index] = time.perf_counter()
        # Both splits' answers often arrive in one frame; without this, split 0's request would
        # wait in the outbox until split 1 was stepped too and the two would move in lockstep.
        self.send_now()

    def _episode_finished(self, msg: EpisodeFinished) -> None:
        self._m_episodes.inc()
        self.episode_finished.emit(msg)

    # ----- slots -----------------------------------------------------------------------------

    def _finish_trajectories(self, split: Split) -> None:
        """Hand the split's full slots to the batcher, take fresh ones when the pool allows."""
        policies = split.finish()
        slots = split.slots
        if self._frozen_from is not None and max(policies) >= self._frozen_from:
            slots, policies = self._release_frozen(slots, policies)
        # stamped with the batcher's epoch: see sfbus_components.datapath.slot_stages
        epochs = self.faults.stages.submit(slots, policies)
        for full, policy, epoch in zip(slots.tolist(), policies, epochs, strict=True):
            self.trajectory_ready.emit(TrajectoryReady(self.worker, full, policy, epoch))
        self.paused.append(split.index)
        self._paused_at[split.index] = time.perf_counter()
        if self._first_wait_s > 0:  # the first full trajectories: hold the splits a while
            self.spawn(self._hold(self._first_wait_s), "decorrelation wait")
            self._first_wait_s = 0.0
        self._resume_paused()
        self._m_free.set(self.pool.free)

    def _release_frozen(self, slots: np.ndarray, policies: list[int],
                        ) -> tuple[np.ndarray, list[int]]:
        """Give the slots a league's frozen opponent owns straight back to the pool (no batcher
        ever sees them); the others and their policies go on to the batchers."""
        frozen = np.array(policies) >= self._frozen_from
        stages = self.faults.stages
        stages.submit(slots[frozen], [p for p, f in zip(policies, frozen, strict=True) if f])
        stages.release(tuple(slots[frozen].tolist()))
        return slots[~frozen], [p for p, f in zip(policies, frozen, strict=True) if not f]

    async def _hold(self, seconds: float) -> None:
        """Keep the splits paused for ``seconds`` as they finish their trajectories."""
        self.log.info("%s: waits %.1f s to decorrelate experience", self.name, seconds)
        self._holding = True
        await asyncio.sleep(seconds)
        self._holding = False
        self._resume_paused()

    def _resume_paused(self) -> None:
        """Give fresh slots to waiting splits in arrival order while the pool has enough."""
        while self.paused and not self._holding:
            split = self.splits[self.paused[0]]
            fresh = split.take_slots(self.pool)
            if fresh is None:
                break
            self.paused.popleft()
            self._paused_s += time.perf_counter() - self._paused_at[split.index]
            self.faults.stages.filling(fresh)
            split.start(fresh)
            self._request(split)
        if self.paused:
            self.log.debug("%s: splits %s wait for slots (%d free)", self.name,
                           list(self.paused), self.pool.free)

    def _slots_back(self) -> None:
        """Slots came back to the pool: resume the splits waiting for them."""
        self._resume_paused()
        self._m_free.set(self.pool.free)

    # ----- timers ----------------------------------------------------------------------------

    def _check_faults(self) -> None:
        """Re-send requests unanswered since the last check; catch up with batcher restarts."""
        for s in self.faults.overdue([split.awaiting for split in self.splits]):
            self._rl_log.warning("resend", "%s: no actions for split %d within %g s; sending its "
                                 "request again (%d so far)", self.name, s,
                                 self.params.inference_timeout_s, self.faults.requests_resent)
            self._request(self.splits[s])
        if self.faults.poll_batchers():
            self._slots_back()

    def _report_progress(self, final: bool = False) -> None:
        # The metrics too are counted here, not per step: a Prometheus increment in multiprocess
        # mode costs a few microseconds, a noticeable share of a split step's own work.
        self._m_frames.inc(self.frames_since_report)
        self._m_idle.inc(self._idle_s)
        self._m_paused.inc(self._paused_s)
        self._idle_s = self._paused_s = 0.0
        self._m_failures.inc(self.envs.failures - self._failures_reported)
        self._failures_reported = self.envs.failures
        by_policy = () if self.population is None else self.population.take_frames()
        self.rollout_progress.emit(RolloutProgress(self.worker, self.frames_since_report,
                                                   by_policy, final))
        self.frames_since_report = 0
