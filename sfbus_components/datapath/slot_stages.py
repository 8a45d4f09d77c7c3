"""Keeping a run training through crashes: slot stages, batcher epochs, learner state recovery.

**Slot stages.** Every rollout worker has, next to its slot pool, a shared array
``<worker>.stage`` (one byte per slot) and ``<worker>.stage_meta`` (the policy and batcher epoch a
slot was submitted to). A slot moves FREE -> FILLING (the worker took it) -> SUBMITTED (it emitted
``TrajectoryReady``) -> QUEUED (the batcher accepted it) -> CONSUMED (the learner copied it, right
before ``SlotsReleased``) -> FREE (the worker took it back). Each stage is written by the process
that owns the slot at that moment, so a restarted process finds out from shared memory who holds
what:

- a restarted worker keeps the slots that are QUEUED with the current epoch (the batcher or the
  learner still holds them and will release them) and reclaims every other slot it finds taken:
  FILLING (its own, torn), SUBMITTED (the message died with it: it restarts in seconds, far longer
  than a live batcher takes to queue a message), CONSUMED (the learner copied it; the release was
  lost) and anything stamped with an older epoch;
- a worker releases a slot on ``SlotsReleased`` only if it is downstream (SUBMITTED, QUEUED or
  CONSUMED): a stale release, for a slot it already reclaimed and refills, is ignored.

**Batcher epochs.** A batcher counts its starts in ``policy.<id>.batcher_starts``; its epoch is the
count minus one, so a run's first batcher is epoch 0 and nothing is released at the first start.
A restarted batcher has lost its queue: it broadcasts ``BatcherStarted(policy, epoch)``. Workers
stamp each ``TrajectoryReady`` with the newest epoch they know; the batcher drops messages stamped
with an older one, and a worker that learns of a newer epoch (the message, or its periodic look at
shared memory, or its own start) releases the slots of that policy stamped older. Both sides
decide by the stamp, so no trajectory is both released and batched. The learner loses the
batches the old batcher held, which is fine. (The learner of the appo topologies shares the
batcher's process and restarts with it; a batch in flight to a learner whose batcher restarted
alone is checked after the copy and dropped if a worker already refills one of its slots.)

The learner's own recovery (published weights, bad updates) is in
:mod:`sfbus_components.learning.faults`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from sfbus import ActorContext, SlotPool
from sfbus_components.datapath.buffers import batcher_starts_name, stage_meta_name, stage_name

FREE, FILLING, SUBMITTED, QUEUED, CONSUMED = range(5)
STAGE_NAMES = ("free", "filling", "submitted", "queued", "consumed")


def _stages(context: ActorContext, worker: str) -> np.ndarray | None:
    name = stage_name(worker)
    return context.shared(name).numpy if name in context.array_specs else None


class BatcherEpochs:
    """The current epoch of each policy's batcher, read from shared memory (0 without one)."""

    def __init__(self, context: ActorContext) -> None:
        self.context = context
        self._counters: dict[int, np.ndarray | None] = {}

    def current(self, policy: int) -> int:
        """The epoch of the batcher of ``policy`` that runs now (or will run first)."""
        counter = self._counters.get(policy, ...)
        if counter is ...:
            name = batcher_starts_name(policy)
            counter = self._counters[policy] = (self.context.shared(name).numpy
                                                if name in self.context.array_specs else None)
        return 0 if counter is None else max(int(counter[0]) - 1, 0)


class WorkerSlots:
    """A rollout worker's side of the slot stages: marks, releases, reclaims, audits."""

    def __init__(self, context: ActorContext, worker: str, pool: SlotPool) -> None:
        self.pool = pool
        self.stage = context.shared(stage_name(worker)).numpy
        self.meta = context.shared(stage_meta_name(worker)).numpy
        self.epochs = BatcherEpochs(context)
        self.known: dict[int, int] = {}
        """The newest batcher epoch this worker knows, by policy."""
        self.stale_releases = 0
        self.reclaimed = 0

    def epoch(self, policy: int) -> int:
        """The epoch to stamp a trajectory of ``policy`` with."""
        known = self.known.get(policy)
        if known is None:
            known = self.known[policy] = self.epochs.current(policy)
        return known

    def reclaim(self) -> int:
        """At (re)start: free every taken slot no batcher or learner holds; returns how many."""
        taken = np.zeros(len(self.stage), bool)
        taken[self.pool.taken()] = True
        self.stage[~taken] = FREE  # a slot the old owner freed but had not marked yet
        freed = 0
        for slot in np.flatnonzero(taken).tolist():
            policy, epoch = self.meta[slot].tolist()
            if self.stage[slot] != QUEUED or epoch < self.epoch(policy):
                self._free(slot)
                freed += 1
        self.reclaimed += freed
        return freed

    def filling(self, slots: np.ndarray) -> None:
        """The worker took ``slots`` and fills them."""
        self.stage[slots] = FILLING

    def submit(self, slots: np.ndarray, policies: list[int]) -> list[int]:
        """Mark ``slots`` submitted to ``policies``' batchers; returns the epochs to stamp."""
        epochs = [self.epoch(p) for p in policies]
        self.meta[slots, 0] = policies
        self.meta[slots, 1] = epochs
        self.stage[slots] = SUBMITTED
        return epochs

    def release(self, slots: tuple[int, ...]) -> int:
        """Take back released ``slots`` that are downstream; returns how many were stale."""
        stale = 0
        size = len(self.stage)
        for slot in slots:
            if 0 <= slot < size and self.stage[slot] >= SUBMITTED:
                self._free(slot)
            else:  # already reclaimed after a restart, maybe refilling: not the sender's to give
                stale += 1
        self.stale_releases += stale
        return stale

    def advance(self, policy: int, epoch: int) -> int:
        """A batcher of ``policy`` started as ``epoch``: release what older ones held."""
        if epoch <= self.epoch(policy):
            return 0
        self.known[policy] = epoch
        lost = np.flatnonzero((self.stage >= SUBMITTED) & (self.meta[:, 0] == policy)
                              & (self.meta[:, 1] < epoch))
        for slot in lost.tolist():
            self._free(slot)
        self.reclaimed += len(lost)
        return len(lost)

    def poll(self) -> int:
        """Catch up with batcher restarts whose announcement this worker missed."""
        return sum(self.advance(p, self.epochs.current(p)) for p in list(self.known))

    def audit(self, active: np.ndarray) -> dict[str, int]:
        """Stage counts of the taken slots, and what does not add up (all zero when exact).

        ``active`` are the slots the worker's unpaused splits fill. ``untracked``: taken but
        marked free; ``orphaned``: free in the pool but marked taken; ``stray_filling``: filling
        but not active (or active but not filling); ``stale``: downstream with an old epoch.
        """
        taken = np.zeros(len(self.stage), bool)
        taken[self.pool.taken()] = True
        counts = {name: int(np.count_nonzero(taken & (self.stage == i)))
                  for i, name in enumerate(STAGE_NAMES)}
        counts["taken"] = int(taken.sum())
        counts["untracked"] = counts.pop("free")
        counts["orphaned"] = int(np.count_nonzero(~taken & (self.stage != FREE)))
        filling = set(np.flatnonzero(self.stage == FILLING).tolist())
        counts["stray_filling"] = len(filling ^ set(np.asarray(active).tolist()))
        downstream = np.flatnonzero(self.stage >= SUBMITTED)
        counts["stale"] = sum(int(self.meta[s, 1]) < self.epoch(int(self.meta[s, 0]))
                              for s in downstream.tolist())
        return counts

    def _free(self, slot: int) -> None:
        # Stage first: a crash between the two leaves a taken slot marked free, reclaimed later.
        self.stage[slot] = FREE
        self.pool.release(slot)


class BatcherSlots:
    """A batcher's side: its epoch, and the workers' stage arrays it marks queued."""

    def __init__(self, context: ActorContext, policy: int, workers: Sequence[str]) -> None:
        starts = batcher_starts_name(policy)
        self.epoch = 0
        if starts in context.array_specs:
            counter = context.shared(starts).numpy
            counter[0] += 1
            self.epoch = int(counter[0]) - 1
        self.stages = [_stages(context, w) for w in workers]
        self.dropped = 0

    def accept(self, worker: int, slot: int, epoch: int) -> bool:
        """Whether to queue a trajectory: stamped for this epoch and still submitted."""
        if epoch < self.epoch:
            self.dropped += 1  # sent to an older batcher: its worker releases it
            return False
        stage = self.stages[worker] if 0 <= worker < len(self.stages) else None
        if stage is None:
            return True  # a worker without stage tracking (a test stand-in)
        if stage[slot] != SUBMITTED:
            self.dropped += 1  # its worker restarted and took it back
            return False
        stage[slot] = QUEUED
        return True


class LearnerSlots:
    """A learner's side: checks a copied batch was intact and marks its slots consumed."""

    def __init__(self, context: ActorContext, workers: Sequence[str],
                 log: logging.Logger | None = None) -> None:
        self.stages = [_stages(context, w) for w in workers]
        self.log = log or logging.getLogger(__name__)
        self.torn_batches = 0

    def torn(self, groups: dict[int, list[int]]) -> bool:
        """Whether a worker already refills a slot of the batch just copied (it is dropped)."""
        for worker, slots in groups.items():
            stage = self.stages[worker]
            if stage is not None and (stage[slots] == FILLING).any():
                self.torn_batches += 1
                self.log.warning("dropped a batch: worker %d took back one of its slots after "
                                 "a restart (%d batches so far)", worker, self.torn_batches)
                return True
        return False

    def consume(self, groups: dict[int, list[int]]) -> None:
        """Mark the batch's downstream slots consumed, before their release is sent."""
        for worker, slots in groups.items():
            stage = self.stages[worker]
            if stage is not None:
                index = np.asarray(slots)
                held = stage[index]
                stage[index[(held == SUBMITTED) | (held == QUEUED)]] = CONSUMED
