"""The batcher: groups finished trajectories of one policy into training batches for its learner.

Trajectories are taken in arrival order; every ``trajectories_per_batch`` of them make a batch,
and full batches wait in a FIFO queue until the learner says it is idle (it does at start and
after each batch), so the learner always has exactly one batch at a time and the rest wait here
as small index records while their data stays in the workers' shared memory.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from sfbus import Actor, ActorContext, ArraySpec, RunRecords, Signal, Topology, slot
from sfbus_components.datapath.buffers import batcher_starts_spec
from sfbus_components.datapath.messages import (
    BatcherStarted,
    BatchReady,
    LearnerIdle,
    TrajectoryReady,
)
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.slot_stages import BatcherSlots


class Batcher(Actor):
    """Assembles ``BatchReady`` records from ``TrajectoryReady`` events for one policy."""

    component = "batcher"
    records = (DataPath,)

    @dataclass(frozen=True)
    class Params:
        """The policy this batcher serves; the batch's size is the run's data path's
        (``context.records[DataPath].params``)."""

        policy: int = 0
        """Policy id; other policies' trajectories are counted and ignored."""

    batch_ready = Signal(BatchReady, "a full batch for the idle learner")
    batcher_started = Signal(BatcherStarted, "(re)started: what an older batcher held is lost")

    def __init__(self, name: str, params: Any = None, context: ActorContext | None = None) -> None:
        super().__init__(name, params, context)
        self.pending_workers: list[int] = []
        self.pending_slots: list[int] = []
        self.queue: deque[BatchReady] = deque()
        self.learner_idle = False
        self.ignored = 0
        metrics = self.metrics
        self._m_trajectories = metrics.counter("trajectories", "trajectories received")
        self._m_ignored = metrics.counter("ignored_trajectories",
                                          "trajectories of other policies, ignored")
        self._m_batches = metrics.counter("batches", "batches sent to the learner")
        self._m_waiting_batches = metrics.gauge("waiting_batches",
                                                "full batches waiting for the learner")
        self._m_waiting_trajectories = metrics.gauge(
            "waiting_trajectories", "trajectories not yet in a full batch")
        self._m_dropped = metrics.counter(
            "dropped_trajectories", "trajectories taken back by their worker after a restart")
        self.slots: BatcherSlots | None = None
        self.trajectories_per_batch = 0
        """Trajectories of T steps in one batch (the data-path record's batch size / T)."""

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """The count of this policy's batcher starts (its epoch, see
        sfbus_components.datapath.slot_stages)."""
        return [batcher_starts_spec(params.policy)]

    async def on_start(self) -> None:
        """Take the next epoch and announce it: the workers release what an older one held."""
        data_path = self.context.records[DataPath]
        self.trajectories_per_batch = data_path.params.trajectories_per_batch
        self.slots = BatcherSlots(self.context, self.params.policy, data_path.workers)
        if self.slots.epoch:
            self.log.warning("%s: restarted as epoch %d; the trajectories the previous batcher "
                             "held are released to their workers", self.name, self.slots.epoch)
        self.batcher_started.emit(BatcherStarted(self.params.policy, self.slots.epoch))

    async def on_stop(self) -> None:
        """Log what the batcher holds (the slot audit of a graceful stop compares it)."""
        self.log.info("%s: holds %d trajectories at stop (%d waiting, %d in full batches)",
                      self.name, len(self.pending_slots) + sum(len(b.slots) for b in self.queue),
                      len(self.pending_slots), sum(len(b.slots) for b in self.queue))

    @slot
    def on_trajectory_ready(self, msg: TrajectoryReady) -> None:
        """Add one trajectory; a batch completes every ``trajectories_per_batch`` of them."""
        if msg.policy != self.params.policy:
            self.ignored += 1
            self._m_ignored.inc()
            return
        if self.slots is not None and not self.slots.accept(msg.worker, msg.slot, msg.epoch):
            self._m_dropped.inc()  # its worker took it back after a restart (or ours)
            return
        self._m_trajectories.inc()
        self.pending_workers.append(msg.worker)
        self.pending_slots.append(msg.slot)
        if len(self.pending_slots) >= self.trajectories_per_batch:
            self.queue.append(BatchReady(self.params.policy, tuple(self.pending_workers),
                                         tuple(self.pending_slots)))
            self.pending_workers.clear()
            self.pending_slots.clear()
        self._send_if_idle()

    @slot
    def on_learner_idle(self, msg: LearnerIdle) -> None:
        """The learner can take a batch: send the oldest waiting one, or the next to complete."""
        if msg.policy != self.params.policy:
            return
        self.learner_idle = True
        self._send_if_idle()

    def _send_if_idle(self) -> None:
        if self.learner_idle and self.queue:
            self.learner_idle = False
            self.batch_ready.emit(self.queue.popleft())
            self._m_batches.inc()
        self._m_waiting_batches.set(len(self.queue))
        self._m_waiting_trajectories.set(len(self.pending_slots))
