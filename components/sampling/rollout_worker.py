"""The rollout worker: steps its envs split by split, writing trajectories into shared memory.

A worker owns ``num_envs`` envs in ``num_splits`` groups (double-buffered sampling, Figure 2 of
the paper): while the inference worker computes actions for one split, the worker steps the other.
Agent ``a`` of env ``e`` is row ``e * num_agents + a``; split ``s`` holds the contiguous rows of
envs ``[s * envs_per_split, (s + 1) * envs_per_split)``. Every row fills its own trajectory slot,
and every split advances its rows' step ``t`` together (see :mod:`components.datapath.buffers` for
what lives at ``[slot, t]``). Observations go straight from the env into the shared buffer.

When a split's slots hold T steps it emits ``trajectory_ready`` per slot and takes fresh slots
from the worker's pool, carrying the last observation and RNN state to step 0. An empty pool
pauses that split until ``slots_released`` brings slots back: that is async mode's back-pressure
and sync mode's pause while the learner trains.

With ``num_policies`` > 1 every agent gets a policy at each episode start from the mapping, a
split sends one request per policy acting in it, and a slot goes to the policy that acted for most
of its steps (see :mod:`components.sampling.policy_mapping`). PBT's reward-shaping coefficients
arrive as ``HyperparamsChanged`` and are applied to the envs whose agents act with that policy.

What the worker does when it, an inference worker or a batcher restarts is in the object it owns
from :mod:`components.sampling.rollout_faults`; its envs, their faults included, in the one from
:mod:`components.sampling.worker_envs`. With ``sampling: batched`` every split fills one
contiguous block of slots, names it in its requests, and steps its envs as one vector straight
into the block's contiguous rows (see :mod:`components.sampling.batched_layout`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from components.datapath.buffers import TrajectoryBuffer, trajectory_layout
from components.datapath.messages import (
    ActionsReady,
    EpisodeFinished,
    InferenceRequest,
    RolloutProgress,
    SlotsReleased,
    TrajectoryReady,
)
from components.datapath.slot_stages import BatcherStarted
from components.envs import EnvError
from components.envs.vector import VectorEnvs
from components.pbt.messages import HyperparamsChanged
from components.sampling.batched_layout import BlockSlots
from components.sampling.policy_mapping import AgentPolicies, load_mapping
from components.sampling.rollout_faults import RolloutFaults
from components.sampling.rollout_params import RolloutParams
from components.sampling.worker_envs import WorkerEnvs
from sfbus import Actor, ArraySpec, RateLimitedLog, Signal, Topology, slot


class RolloutWorker(Actor):
    """Steps ``num_envs`` envs in ``num_splits`` splits with actions from the inference workers."""

    component = "rollout"
    Params = RolloutParams

    inference_requested = Signal(InferenceRequest, "a split's rows await actions")
    trajectory_ready = Signal(TrajectoryReady, "a slot holds T steps")
    episode_finished = Signal(EpisodeFinished, "an agent finished an episode")
    rollout_progress = Signal(RolloutProgress, "env frames since the last report")

    @classmethod
    def shared_arrays(cls, name: str, params: RolloutParams,
                      topology: Topology) -> list[ArraySpec]:
        """The worker's trajectory buffer, request table and slot pool."""
        return trajectory_layout(params, topology).array_specs(name)

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
        layout = trajectory_layout(p, self.context.table.topology)
        self.spec = layout.spec
        self.buffer = TrajectoryBuffer(self.context, self.name, layout)
        self.pool = self.context.slot_pool(f"{self.name}.pool", owner=self.name, actor=self.name)
        self._rl_log = RateLimitedLog(self.log)
        self.blocks = (BlockSlots(self.context, self.name, self.pool, layout.rows_per_split)
                       if p.sampling == "batched" else None)

        self.num_agents = na = self.spec.num_agents
        self.rollout = p.rollout
        self.envs_per_split = p.num_envs // p.num_splits
        self.rows_per_split = layout.rows_per_split
        agents = p.num_envs * na
        # Per-agent policy id; with a population the mapping rewrites entries at episode starts.
        self.population: AgentPolicies | None = None
        self.agent_policy = np.full(agents, p.policy, np.int64)
        if p.num_policies > 1:
            mapping = load_mapping(p.policy_mapping, p.num_policies, self.worker, p.seed)
            self.population = AgentPolicies(mapping, p.num_policies, p.num_envs, na, p.num_splits)
            self.agent_policy = self.population.policy
        # Current slot of every agent row (while its split is paused: the slot it just filled).
        self.row_slots = np.zeros(agents, np.int64)  # taken split by split below
        self.t = [0] * p.num_splits  # the step every row of a split is at
        self.awaiting = [0] * p.num_splits  # inference requests of the split still in flight
        # Splits that filled their slots and wait for free ones, first come first served.
        self.paused: deque[int] = deque()
        self.frames_since_report = 0

        self._prepare_staging()
        # Reclaims what a previous incarnation of this worker left taken.
        self.faults = RolloutFaults(self.context, self.name, self.pool, p.num_splits, self.log)
        self.envs = WorkerEnvs(p, self.name, self.worker, self.faults.restart_salt, na,
                               self.agent_policy, self.log, self.fail_process)
        # Reset into the carry: every split starts like one resuming from a pause, so that a
        # restarted worker waits for slots the batcher still holds instead of failing.
        self.envs.create([{k: v[i * na:(i + 1) * na] for k, v in self._carry_obs[s].items()}
                          for s in range(p.num_splits) for i in range(self.envs_per_split)])
        # Batched: each split's envs step as one vector into the split's contiguous rows.
        self.vectors = ([VectorEnvs(self.envs.envs, s * self.envs_per_split,
                                    self.envs_per_split, na, self.envs.recreate)
                         for s in range(p.num_splits)]
                        if self.blocks is not None else [])
        self.paused.extend(range(p.num_splits))
        self._resume_paused()  # takes each split's slots and requests its actions
        self._m_free.set(self.pool.free)
        self.every(p.progress_interval_s, self._report_progress)
        self.every(p.inference_timeout_s, self._check_faults)

    def _prepare_staging(self) -> None:
        """Bind the buffer's fields, preallocate per-split staging arrays, declare metrics."""
        p, na, rps = self.params, self.num_agents, self.rows_per_split
        fields = self.buffer.numpy
        self._obs = self.buffer.obs_numpy()
        self._rnn, self._actions = fields["rnn"], fields["actions"]
        self._rewards, self._dones, self._policies = (fields["rewards"], fields["dones"],
                                                      fields["policies"])
        # Preallocated per-split staging: one fancy-index write per field and step, no allocation.
        self._step_rewards = [np.zeros(rps, np.float32) for _ in range(p.num_splits)]
        self._step_dones = [np.zeros(rps, bool) for _ in range(p.num_splits)]
        # The carried observation/state is staged here: once a paused split's slots are
        # released, another split may reuse and overwrite them before this one resumes.
        self._carry_obs = [{k: np.zeros((rps, *f.shape), f.dtype)
                            for k, f in self.spec.observation_space.items()}
                           for _ in range(p.num_splits)]
        self._carry_rnn = [np.zeros((rps, self._rnn.shape[-1]), np.float32)
                           for _ in range(p.num_splits)]
        # Multi-agent envs write into a scratch dict whose rows are then scattered to the slots.
        self._scratch = [self.spec.empty_obs() for _ in range(p.num_envs)] if na > 1 else []
        self._failed_step = (np.zeros(na, np.float32), np.ones(na, bool), np.zeros(na, bool),
                             [{} for _ in range(na)])
        self._frames_per_split_step = self.envs_per_split * na * self.spec.frameskip

        self._m_frames = self.metrics.counter("env_frames", "Env frames collected (frameskip "
                                              "counted)")
        self._m_episodes = self.metrics.counter("episodes", "Episodes finished by agents")
        self._m_failures = self.metrics.counter("env_failures",
                                                "Envs recreated after an EnvError")
        self._failures_reported = 0
        self._m_free = self.metrics.gauge("free_slots", "Free trajectory slots in the pool")

    async def on_stop(self) -> None:
        """Log the slot audit, close every env and stop their watchdog."""
        if hasattr(self, "envs"):
            rps = self.rows_per_split
            self.faults.audit([self.row_slots[s * rps:(s + 1) * rps] for s in range(len(self.t))
                               if s not in self.paused])
            self.envs.close()

    @slot
    def on_actions_ready(self, msg: ActionsReady) -> None:
        """Step the split whose actions the inference worker wrote, then request its next ones."""
        s = msg.split
        if (msg.worker != self.worker or not 0 <= s < len(self.t) or not self.awaiting[s]
                or self.faults.stale(s, msg.seq)):  # stale: answers a request sent again since
            self._rl_log.warning("stray-actions", "%s: ignored unexpected %r (worker %d)",
                                 self.name, msg, self.worker)
            return
        self.awaiting[s] -= 1
        if not self.awaiting[s]:  # every policy group of the split has its actions
            self._step_split(s)

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

    # ----- the hot path ----------------------------------------------------------------------

    def _step_split(self, s: int) -> None:
        """Step every env of split ``s`` with the actions at its rows' step t."""
        t, t1 = self.t[s], self.t[s] + 1
        na, rps = self.num_agents, self.rows_per_split
        lo = s * rps
        slots_view = self.row_slots[lo:lo + rps]
        rows = self._rows(s)
        # Batched: the split's rows at a step are one contiguous array of every field (a view).
        at, at1 = self.buffer.at(rows, t), self.buffer.at(rows, t1)
        actions = self._actions[at]  # one gather (or view) for the whole split
        rewards, dones = self._step_rewards[s], self._step_dones[s]
        if self.vectors:
            obs = {k: arr[at1] for k, arr in self._obs.items()}
            for a, infos in self.vectors[s].step_into(actions, obs, rewards, dones):
                self._episodes_ended(lo + a, infos)
            any_done = dones.any()  # an env that failed is done without an episode to report
        else:  # env by env: the split's slots may lie anywhere in the [slot, t] layout
            any_done = False
            slots = slots_view.tolist()
            e0 = s * self.envs_per_split
            for i, env in enumerate(self.envs.envs[e0:e0 + self.envs_per_split]):
                e, a = e0 + i, i * na
                out = self._obs_out(e, slots, a, t1)
                try:
                    r, term, trunc, infos = env.step_into(actions[a:a + na], out)
                except EnvError as error:
                    self.envs.recreate(e, out, error)
                    r, term, trunc, infos = self._failed_step
                if na == 1:  # scalar writes beat slice writes for the common single-agent env
                    rewards[a] = r[0]
                    done = dones[a] = term[0] or trunc[0]
                else:
                    self._commit_obs(out, slots, a, t1)
                    rewards[a:a + na] = r
                    np.logical_or(term, trunc, out=dones[a:a + na])
                    done = dones[a:a + na].any()
                if done:
                    any_done = True
                    self._episodes_ended(lo + a, infos)
        self._rewards[at] = rewards
        self._dones[at] = dones
        if self.population is not None:  # one policy: written once per slot (_resume_paused)
            self._policies[at] = self.agent_policy[lo:lo + rps]
            self.population.count_frames(s, self.spec.frameskip)
            # After recording who acted at t: the next episodes' policies act from t + 1.
            if self.population.ended:
                for row in self.population.switch():
                    if row % na == 0:
                        self.envs.apply_shaping(row // na)
        if any_done:
            # forward_step never resets state: a new episode starts from zeros, overwriting the
            # state the inference worker already wrote at t+1.
            self._rnn[self.buffer.at(slots_view[dones], t1)] = 0.0

        frames = self._frames_per_split_step
        self.report_progress(frames)
        self.frames_since_report += frames
        if t1 == self.rollout:
            self._finish_trajectories(s)
        else:
            self.t[s] = t1
            self._request(s)

    def _obs_out(self, e: int, slots: list[int], a: int, t: int) -> dict[str, np.ndarray]:
        """Where env ``e`` (agents at ``slots[a:]``) writes: its shared row, or its scratch."""
        if self.num_agents > 1:
            return self._scratch[e]
        row = slots[a]
        out: dict[str, np.ndarray] = {}
        for k, arr in self._obs.items():  # a loop: in Python 3.11 a comprehension is a call
            out[k] = arr[row:row + 1, t]
        return out

    def _commit_obs(self, out: dict[str, np.ndarray], slots: list[int], a: int, t: int) -> None:
        """Scatter a multi-agent env's scratch rows to its agents' slots at step ``t``."""
        env_slots = slots[a:a + self.num_agents]
        for k, arr in self._obs.items():
            arr[env_slots, t] = out[k]

    def _episodes_ended(self, row0: int, infos: list[dict[str, Any]]) -> None:
        """Report the episodes the env's agents (rows from ``row0``) finished in this step."""
        for j, info in enumerate(infos):
            if "episode_return" in info:
                self._m_episodes.inc()
                other = info.get("episode_opponent")  # the opponent's agent index in this env
                self.episode_finished.emit(EpisodeFinished(
                    int(self.agent_policy[row0 + j]), float(info["episode_return"]),
                    int(info["episode_length"]), int(info["episode_frames"]),
                    float(info.get("episode_true_return", math.nan)),
                    float(info.get("episode_win", math.nan)),
                    -1 if other is None else int(self.agent_policy[row0 + other])))
                if self.population is not None:
                    self.population.ended.append(row0 + j)

    def _request(self, s: int) -> None:
        """Ask for split ``s``'s actions, sent at once so the next split steps meanwhile."""
        self._write_request(s)
        # Both splits' answers often arrive in one frame; without this, split 0's request would
        # wait in the outbox until split 1 was stepped too and the two would move in lockstep.
        self.send_now()

    def _write_request(self, s: int) -> None:
        """Write split ``s``'s (slot, t) rows to the request table and emit its request(s)."""
        rps = self.rows_per_split
        rows = self.buffer.requests[s]
        seq = self.faults.next_seq(s)
        if self.blocks is not None:  # one contiguous block: no request table to write
            self.awaiting[s] = 1
            self.inference_requested.emit(InferenceRequest(
                self.worker, s, rps, self.params.policy, seq=seq,
                block=int(self.row_slots[s * rps]), t=self.t[s]))
            return
        if self.population is not None:
            # One request per policy acting in the split, its rows contiguous in the table and
            # keyed by policy: with several inference replicas each serves a fixed subset.
            groups = self.population.groups(s)
            rows[:rps, 0] = self.row_slots[groups.rows]
            rows[:rps, 1] = self.t[s]
            self.awaiting[s] = len(groups.groups)
            for policy, offset, count in groups.groups:
                self.inference_requested.emit(
                    InferenceRequest(self.worker, s, count, policy, offset, seq), key=policy)
            return
        if self.t[s] == 0:  # a split's slots change only when it takes fresh ones, at t = 0
            rows[:rps, 0] = self.row_slots[s * rps:(s + 1) * rps]
        rows[:rps, 1] = self.t[s]
        self.awaiting[s] = 1
        self.inference_requested.emit(InferenceRequest(self.worker, s, rps, self.params.policy,
                                                       seq=seq))

    # ----- slots -----------------------------------------------------------------------------

    def _finish_trajectories(self, s: int) -> None:
        """Hand split ``s``'s full slots to the batcher, stage the carry, take fresh slots."""
        rps, last = self.rows_per_split, self.rollout
        lo = s * rps
        slots_view = self.row_slots[lo:lo + rps]
        at = self.buffer.at(self._rows(s), last)
        for k, arr in self._obs.items():
            self._carry_obs[s][k][:] = arr[at]
        self._carry_rnn[s][:] = self._rnn[at]
        if self.population is None:
            policies = self.agent_policy[lo:lo + rps].tolist()
        else:  # a slot where an agent switched policy goes to its majority policy
            policies = self.population.owners(
                s, self._policies[self.buffer.at(slots_view, slice(last))])
        # stamped with the batcher's epoch: see components.datapath.slot_stages
        epochs = self.faults.stages.submit(slots_view, policies)
        for full, policy, epoch in zip(slots_view.tolist(), policies, epochs, strict=True):
            self.trajectory_ready.emit(TrajectoryReady(self.worker, full, policy, epoch))
        self.paused.append(s)
        self._resume_paused()
        self._m_free.set(self.pool.free)

    def _resume_paused(self) -> None:
        """Give fresh slots to waiting splits in arrival order while the pool has enough."""
        rps = self.rows_per_split
        while self.paused:
            fresh = self._take_slots()
            if fresh is None:
                break
            s = self.paused.popleft()
            self.faults.stages.filling(fresh)
            lo = s * rps
            self.row_slots[lo:lo + rps] = fresh
            if self.population is None:  # every step of the slot is acted on by the same policy
                self._policies[self.buffer.at(self._rows(s), slice(None))] = \
                    self.agent_policy[lo:lo + rps, None]
            at = self.buffer.at(self._rows(s), 0)
            for k, arr in self._obs.items():
                arr[at] = self._carry_obs[s][k]
            self._rnn[at] = self._carry_rnn[s]
            self.t[s] = 0
            self._request(s)
        if self.paused:
            self.log.debug("%s: splits %s wait for slots (%d free)", self.name,
                           list(self.paused), self.pool.free)

    def _slots_back(self) -> None:
        """Slots came back to the pool: resume the splits waiting for them."""
        self._resume_paused()
        self._m_free.set(self.pool.free)

    def _rows(self, s: int) -> np.ndarray | slice:
        """Split ``s``'s slots: its block as a slice when batched (so fields give views)."""
        lo = s * self.rows_per_split
        if self.blocks is None:
            return self.row_slots[lo:lo + self.rows_per_split]
        first = int(self.row_slots[lo])
        return slice(first, first + self.rows_per_split)

    def _take_slots(self) -> np.ndarray | None:
        """A split's fresh slots (batched: one free block), or None while too few are free."""
        if self.blocks is not None:
            return self.blocks.try_acquire()
        if self.pool.free < self.rows_per_split:
            return None
        return np.array(self.pool.acquire_many(self.rows_per_split), np.int64)

    # ----- timers ----------------------------------------------------------------------------

    def _check_faults(self) -> None:
        """Re-send requests unanswered since the last check; catch up with batcher restarts."""
        for s in self.faults.overdue(self.awaiting):
            self._rl_log.warning("resend", "%s: no actions for split %d within %g s; sending its "
                                 "request again (%d so far)", self.name, s,
                                 self.params.inference_timeout_s, self.faults.requests_resent)
            self._request(s)
        if self.faults.poll_batchers():
            self._slots_back()

    def _report_progress(self) -> None:
        # The metrics too are counted here, not per step: a Prometheus increment in multiprocess
        # mode costs a few microseconds, a noticeable share of a split step's own work.
        self._m_frames.inc(self.frames_since_report)
        self._m_failures.inc(self.envs.failures - self._failures_reported)
        self._failures_reported = self.envs.failures
        by_policy = () if self.population is None else self.population.take_frames()
        self.rollout_progress.emit(RolloutProgress(self.worker, self.frames_since_report,
                                                   by_policy))
        self.frames_since_report = 0

    # ----- population-based training ---------------------------------------------------------

    @slot
    def on_hyperparams_changed(self, msg: HyperparamsChanged) -> None:
        """Take a policy's reward-shaping coefficients; apply them to the envs it acts in."""
        shaping = {name.removeprefix("reward_shaping."): value
                   for name, value in zip(msg.names, msg.values, strict=True)
                   if name.startswith("reward_shaping.")}
        if shaping:
            self.envs.set_shaping(msg.policy, shaping)
