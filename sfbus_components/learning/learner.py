"""The learner of one policy: copies a batch out of shared memory, trains APPO, publishes weights.

Per batch: one gather copy of the batch's trajectories into local tensors
(:mod:`sfbus_components.learning.batch_copy`; the workers get their slots back at once in async
mode), V-trace + PPO epochs in a background thread (torch releases the GIL, so the event loop keeps
moving signals meanwhile), then the new weights are published in shared memory under version + 1.
In async mode the next batch is copied out while one trains (the copy alternates between two
buffers), so its slots go back to the workers a training step sooner.
Checkpoints go to ``<run_dir>/checkpoints/policy_<id>/``; a run directory that already holds some
resumes from the newest (``sfbus run FILE --resume RUN_DIR``), whose env frames then count
towards the run's ``--max-frames`` (Sample Factory's ``train_for_env_steps`` counts from the
checkpoint too).

What training changes (policy, Adam, normalizers, counters) is one
:class:`~sfbus_components.learning.training_state.TrainingState` on the device the learner trains
on; a batch is copied out of shared memory on the host and enters the device in ``train``. The
learner owns its population role as a
:class:`~sfbus_components.learning.population_member.PopulationMember` and its fault handling as a
:class:`~sfbus_components.learning.faults.NumericsGuard`, both over that state.

Env, model, trajectory length, batch size, mode and seed are the data path's, read from the run
record (``context.records[DataPath].params``) like every actor's but the rollout's; observation
statistics are updated iff ``model.normalize_input``, and observations always go through the
policy's ``ObsNormalizer``, as in inference: vectors by their running statistics, uint8 images per
pixel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from sfbus import (
    Actor,
    ActorContext,
    ArraySpec,
    RunRecords,
    Signal,
    Topology,
    keep_freed_memory,
    slot,
)
from sfbus_components.algo.trajectories import Trajectories
from sfbus_components.datapath.buffers import PolicyWeights, TrajectoryBuffer, policy_array_specs
from sfbus_components.datapath.messages import (
    BatchReady,
    EpisodeFinished,
    HyperparamsChanged,
    LearnerIdle,
    PolicyReplaced,
    ReplacePolicy,
    SlotsReleased,
    TrainingResumed,
    TrainingStats,
    WeightsUpdated,
)
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.settings import DataPathParams, build_policy, policy_spec
from sfbus_components.datapath.slot_stages import LearnerSlots
from sfbus_components.learning.appo_update import AppoUpdate
from sfbus_components.learning.batch_copy import BatchCopy
from sfbus_components.learning.checkpoint import config_fingerprint, load_newest
from sfbus_components.learning.checkpoint_schedule import Kind, LearnerCheckpoints
from sfbus_components.learning.distributed import Peers, check_supported, join_peers
from sfbus_components.learning.faults import NumericsGuard, restore_published
from sfbus_components.learning.learner_params import LearnerParams
from sfbus_components.learning.population_member import PopulationMember
from sfbus_components.learning.training_report import TrainingReport
from sfbus_components.learning.training_state import TrainingState
from sfbus_components.models.device import describe_device, resolve_device

_T = TypeVar("_T")


class Learner(Actor):
    """Trains one policy with APPO on the batches its batcher sends; a member of PBT's
    population when a topology wires its PBT slots."""

    component = "learner"
    records = (DataPath,)

    Params = LearnerParams
    """The learner's parameters (:mod:`sfbus_components.learning.learner_params`)."""

    learner_idle = Signal(LearnerIdle, "ready for the next batch")
    slots_released = Signal(SlotsReleased, "a worker's slots were copied (one per worker)")
    weights_updated = Signal(WeightsUpdated, "new weights are published")
    training_stats = Signal(TrainingStats, "losses and health figures of one training step")
    policy_replaced = Signal(PolicyReplaced, "this learner now trains a copy of another policy")
    training_resumed = Signal(TrainingResumed, "resumed from a checkpoint at the run's start")

    data: DataPathParams
    """The run's data path: env, model, T, batch size, mode, seed (from ``build``)."""
    training: TrainingState
    """Policy, optimizer, normalizers and counters (from ``build``)."""
    population: PopulationMember
    """This learner's part in PBT (from ``build``)."""
    batches: BatchCopy
    """Copies each batch out of the workers' buffers (from ``on_start``)."""

    def __init__(self, name: str, params: Any = None, context: ActorContext | None = None) -> None:
        super().__init__(name, params, context)
        self.checkpoints: LearnerCheckpoints | None = None
        """The checkpoint schedule; None without a run directory."""
        self._background: asyncio.Future[Any] | None = None
        self._training: asyncio.Future[None] | None = None
        """Async mode: the batch training while the next one is copied out."""
        self._stopping = False
        self._failed_batches = 0
        self.peers: Peers | None = None
        self.report = TrainingReport(self.metrics, self.log, name, self.params.policy)
        """Metrics, warnings and the ``TrainingStats`` of each trained batch."""

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """The policy's published weights and their version counter; refuses APPO settings the
        run's data path cannot feed (before anything starts, at the learner's place in the
        file)."""
        data = records[DataPath]
        check_supported(data.params.num_policies)
        params.check_data_path(data.params)
        return policy_array_specs(params.policy, data.weights_size(params.policy))

    # ----- setup ---------------------------------------------------------------------------

    def build(self, device: torch.device | str = "cpu", data: DataPathParams | None = None) -> None:
        """Create the training state on ``device``, the PBT role and the numerics guard over
        it, for the data path ``data`` (None: the run record's); no shared memory."""
        p = self.params
        self.data = self.context.records[DataPath].params if data is None else data
        p.check_data_path(self.data)
        torch.set_num_threads(p.torch_threads)
        keep_freed_memory()  # set already where a run's process started; not in serial mode
        self.spec = policy_spec(self.data, p.policy)  # agent_policies: its own agents' spaces
        self.training = TrainingState(build_policy(self.data, p.policy), p.appo, self.data.seed,
                                      device)
        if self.training.device.type == "cpu":
            self.training.policy.model.sequence_threads = p.sequence_threads
        run_dir = None if self.context is None else self.context.run_dir
        self.population = PopulationMember(p.policy, self.training, self.config_fingerprint(),
                                           run_dir, self.log, self.name)
        self._numerics = NumericsGuard(self.training, p.max_bad_updates, p.good_state_every,
                                       self.log, self.name, self.report.restores)
        self._restores_reported = 0
        max_frames = None if self.context is None else self.context.limits.max_frames
        if self.context is not None:
            p.check_limits(self.context.limits)
        if p.appo.exploration_loss == "symmetric_kl" and self.spec.is_continuous:
            raise ValueError(f"{self.name}: appo.exploration_loss symmetric_kl needs categorical "
                             f"actions; env {self.data.env!r} has continuous ones (use entropy)")
        self.update = AppoUpdate(self.training, self.population, self._numerics,
                                 self.spec, self.data, max_frames)

    async def on_start(self) -> None:
        """Build, attach the workers' buffers, resume from a checkpoint, publish, say idle."""
        assert self.context is not None
        p = self.params
        self.build(resolve_device(p.device, p.policy))
        self.log.info("%s: policy %d trains on %s", self.name, p.policy,
                      describe_device(self.training.device))
        data_path = self.context.records[DataPath]
        rollout = self.data.rollout
        self.batches = BatchCopy(
            [TrajectoryBuffer(self.context, w, data_path.layout.of_policy(p.policy))
             for w in data_path.workers],
            rollout, self.data.state_size, pin=self.training.device.type == "cuda",
            every_state=p.every_state(rollout))
        self._slot_stages = LearnerSlots(self.context, data_path.workers, self.log)
        self.weights = PolicyWeights(self.context, p.policy)
        if self.context.run_dir is not None:
            self.checkpoints = LearnerCheckpoints(
                Path(self.context.run_dir, "checkpoints", f"policy_{p.policy}"), p.policy, p)
            newest = load_newest(self.checkpoints.folder, self.config_fingerprint(),
                                 log=self.log, map_location=self.training.device)
            if newest is not None:
                self.restore(newest[1])
                self.log.info("%s: resumed from %s (version %d)", self.name, newest[0],
                              self.training.version)
                if self.weights.version == 0:  # the run's first start, not a restart
                    # --max-frames counts on from the frames trained before the resume, as
                    # Sample Factory's train_for_env_steps counts from a checkpoint's env_steps
                    self.context.add_progress(self.training.env_frames)
                    self.training_resumed.emit(TrainingResumed(p.policy,
                                                               self.training.env_frames))
        if restore_published(self.weights, self.training):  # newer than the checkpoint
            self.log.warning("%s: restarted; continues from the weights it published last "
                             "(version %d)", self.name, self.training.version)
        else:  # a restarted learner cannot rejoin: its peers ended the group when it died
            audit = None if self.context.run_dir is None else Path(
                self.context.run_dir, "logs", f"distributed_policy_{p.policy}.jsonl")
            self.peers = await self._in_thread(join_peers, self.training, p.peer_timeout_s,
                                               self.log, self.name, audit)
        self._publish()
        self.report_advance("trained batches", 0)  # watched from now on (run.progress_timeout_s)
        self.learner_idle.emit(LearnerIdle(p.policy))

    # ----- the batch cycle ------------------------------------------------------------------

    @slot
    async def on_batch_ready(self, msg: BatchReady) -> None:
        """Train on the batch; whatever happens, say idle after (the batcher waits for it).

        In async mode the learner says idle once it holds the batch's copy and the previous
        batch has trained, with this one's training started: the batcher's next batch is then
        copied out (and its slots go back to their workers) while this one trains, instead of
        after it."""
        if self._stopping:
            return
        try:
            if self.data.mode == "async":
                batch = await self._counted(self._take(msg))
                await self._settle()
                if batch is not None and not self._stopping:
                    self._training = asyncio.ensure_future(
                        self._counted(self._train_and_publish(batch)))
            else:
                await self._counted(self._learn(msg))
        finally:
            self.learner_idle.emit(LearnerIdle(self.params.policy))

    async def _counted(self, step: Awaitable[_T]) -> _T | None:
        """``step``'s result, or None where it raised: the failure is reported, and the
        process fails after ``max_failed_batches`` of them in a row (the batcher must not wait
        forever on a learner that raises)."""
        try:
            result = await step
        except Exception as error:
            self._failed_batches += 1
            self.report_failure("on_batch_ready", error)
            if self._failed_batches >= self.params.max_failed_batches:
                self.fail_process(f"{self._failed_batches} batches in a row failed, the last "
                                  f"with {error!r}")
            return None
        return result

    async def _settle(self) -> None:
        """Wait until the batch in training (if any) is trained, published and reported."""
        if self._training is not None:
            await asyncio.wait({self._training})
            self._training = None

    async def _take(self, msg: BatchReady) -> Trajectories | None:
        """Async mode: copy the batch out and give its slots back at once; None where it is
        dropped (see :meth:`_dropped`)."""
        batch, groups = self.batches.copy(msg)
        self._release(groups)
        return None if self._dropped(batch, groups) else batch

    async def _learn(self, msg: BatchReady) -> None:
        """Sync mode: copy the batch out, train, publish; its slots go back after training
        (also when it fails), when the sampler resumes."""
        batch, groups = self.batches.copy(msg)
        try:
            if not self._dropped(batch, groups):
                await self._train_and_publish(batch)
        finally:
            self._release(groups)

    def _dropped(self, batch: Trajectories, groups: dict[int, list[int]]) -> bool:
        """A restarted worker already refills one of its slots
        (sfbus_components.datapath.slot_stages), or the batch has only steps of weights a PBT
        exchange replaced."""
        return self._slot_stages.torn(groups) or self.population.discards(batch)

    async def _train_and_publish(self, batch: Trajectories) -> None:
        """Train, publish, report, checkpoint when due."""
        result = await self._in_thread(self.train, batch)
        self._publish()
        self._failed_batches = 0
        self._report(result)
        kinds = () if self.checkpoints is None else self.checkpoints.due(self.training.env_frames)
        if kinds:
            try:
                await self._in_thread(self.save, kinds)
            except Exception as error:  # disk full, folder replaced: retried at the next interval
                self.report.checkpoint_failures.inc()
                self.report_failure("checkpoint", error)

    def train(self, batch: Trajectories) -> dict[str, Any]:
        """APPO epochs over ``batch`` (the ``BatchCopy`` layout, on the host); bumps the
        version. Any thread."""
        return self.update(batch, self.params, self.peers)

    def _release(self, groups: dict[int, list[int]]) -> None:
        self._slot_stages.consume(groups)  # before the release: a restarted worker reclaims them
        for worker, slots in groups.items():
            self.slots_released.emit(SlotsReleased(worker, tuple(slots)), key=worker)

    def _publish(self) -> None:
        version = self.training.version
        self.weights.publish(self.training.policy.published_tensors(), version)
        self.weights_updated.emit(WeightsUpdated(self.params.policy, version))
        self.report.published(version)

    def _report(self, r: dict[str, Any]) -> None:
        appo = self.params.appo
        # Each restore of the last good state is a contained failure: it counts against the
        # run's per-actor budget like a slot that raised (restores between finite updates
        # otherwise go on for ever).
        for _ in range(self._numerics.restores - self._restores_reported):
            self.report_failure("numerics", FloatingPointError(
                "non-finite updates in a row: the last good state was restored"))
        self._restores_reported = self._numerics.restores
        if r["skipped"] < appo.num_epochs * appo.num_batches_per_epoch:  # the weights changed
            self.report_advance("trained batches")
        self.training_stats.emit(self.report.stats(r, self.training, self.spec.frameskip))

    async def _in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        # Shielded so that a stop waits for the thread instead of abandoning it mid-update.
        self._background = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        return await asyncio.shield(self._background)

    # ----- checkpoints ----------------------------------------------------------------------

    def config_fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed (see ``checkpoint.config_fingerprint``)."""
        return config_fingerprint(self.data.env, self.data.model)

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint holds: the training state (CPU tensors), the configuration's
        fingerprint and PBT's changes (call between training steps)."""
        return {**self.training.state_dict(), "config": self.config_fingerprint(),
                **self.population.state()}

    def restore(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's state (from ``load_checkpoint``) into the built learner."""
        self.training.load_state_dict(state)
        if self.checkpoints is not None:
            self.checkpoints.restore(state)
        self.params = self.population.restore(state, self.params)

    def save(self, kinds: tuple[Kind, ...] = ("latest",)) -> Path | None:
        """Write the current state as checkpoints of ``kinds``; returns the first one written
        (None without a run directory)."""
        if self.checkpoints is None:
            return None
        return self.checkpoints.write(self.state(), self.training.version, kinds)[0]

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Count an episode of this policy towards the best checkpoint's metric."""
        if self.checkpoints is not None:
            self.checkpoints.on_episode(msg)

    # ----- population-based training (learning.population_member) --------------------------------

    @slot
    async def on_hyperparams_changed(self, msg: HyperparamsChanged) -> None:
        """Apply this policy's new hyperparameters (between training steps)."""
        if msg.policy == self.params.policy:
            await self._settle()
            self.params = self.population.apply_hyperparams(
                self.params, dict(zip(msg.names, msg.values, strict=True)))

    @slot
    async def on_replace_policy(self, msg: ReplacePolicy) -> None:
        """A weight exchange, between training steps: write our snapshot (source) or become
        a copy of the source's and publish it (target)."""
        me = self.params.policy
        if msg.source == msg.policy or me not in (msg.source, msg.policy):
            return
        await self._settle()
        if msg.source == me:
            await self._in_thread(self.population.write_snapshot, msg, self.state())
            return
        copied = await self.population.take_snapshot(msg, self.params.appo,
                                                     lambda: self._stopping)
        if copied is not None:
            self._numerics.forget()  # a later numerics restore must not bring back old weights
            self._publish()  # inference sees a newer version and reloads at once
            if self.checkpoints is not None:
                await self._in_thread(self.save)  # a resume must not undo the exchange
        self.policy_replaced.emit(PolicyReplaced(me, msg.source, msg.exchange,
                                                 self.training.version,
                                                 -1 if copied is None else copied,
                                                 ok=copied is not None))

    async def on_stop(self) -> None:
        """Wait for an in-flight training step or save, then write the final checkpoint."""
        self._stopping = True
        await self._settle()  # the batch in training: trained, published, its checkpoint due
        # A finished step's continuation may start a periodic save: wait until nothing runs.
        while self._background is not None and not self._background.done():
            await asyncio.wait({self._background})
        if self.peers is not None:  # before saving: the others may be waiting in a step for us
            await self._in_thread(self.peers.close)
        if self.checkpoints is not None:  # on the loop: nothing else may touch the model now
            # named by the supervisor if this process is killed at its stop timeout
            self.note(f"writing policy {self.params.policy}'s final checkpoint; the newest "
                      f"written is {self.checkpoints.newest()}")
            path = self.checkpoints.write_final(self.state(), self.training.version)
            self.log.info("%s: final checkpoint %s (version %d)", self.name, path,
                          self.training.version)


