"""Faults the data path survives: restarted workers and batchers, lost or stale inference answers.

Processes are "restarted" in this test process: their host is stopped (its actors' memory is
gone, as after a kill) and a new one is built on the same shared memory and sockets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np

from sfbus import Actor, Signal, slot
from sfbus.host import ProcessHost
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology
from sfbus_components.datapath.messages import (
    ActionsReady,
    InferenceRequest,
    SlotsReleased,
    TrajectoryReady,
)
from sfbus_components.datapath.slot_stages import (
    CONSUMED,
    QUEUED,
    SUBMITTED,
    BatcherSlots,
    LearnerSlots,
)
from sfbus_components.learning.batcher import Batcher
from tests.components.sampling.test_rollout import StandInInference, steps, topology, wait_until
from tests.kernel.conftest import hosted


async def restart(actors: dict[str, Any], process: str) -> dict[str, Any]:
    """Stop the host of ``process`` and start a fresh one in its place; returns its actors."""
    hosts: list[ProcessHost] = actors["_hosts"]
    index = next(i for i, h in enumerate(hosts) if h.hosted == [process])
    old = hosts[index]
    await old.stop()
    new = ProcessHost(old.table, [process], run_id=old.run_id, run_dir=old.run_dir,
                      sock_dir=old.sock_dir, array_specs=old.array_specs,
                      records=old.records)
    await new.build()
    await new.start()
    hosts[index] = new
    fresh = {a.name: a for a in new.actors}
    actors.update(fresh)
    return fresh


class HoldingBatcher(Actor):
    """Queues trajectories as a batcher does (marking their stage) and holds them."""

    slots_released = Signal(SlotsReleased)

    async def on_start(self) -> None:
        """Attach the worker's slot stages."""
        self.queue = BatcherSlots(self.context, 0, ["rollout"])
        self.learner = LearnerSlots(self.context, ["rollout"])
        self.held: list[int] = []

    @slot
    def on_trajectory_ready(self, msg: TrajectoryReady) -> None:
        """Queue and hold the slot."""
        if self.queue.accept(msg.worker, msg.slot, msg.epoch):
            self.held.append(msg.slot)

    def release(self, count: int | None = None, send: bool = True) -> list[int]:
        """Consume the oldest ``count`` held slots; release them unless the message is 'lost'."""
        count = len(self.held) if count is None else count
        taken, self.held = self.held[:count], self.held[count:]
        self.learner.consume({0: taken})
        if send and taken:
            self.slots_released.emit(SlotsReleased(0, tuple(taken)), key=0)
        return taken


def sampler_topology(target: str, target_class: str, wires: list[tuple[str, ...]],
                     inference: str = "StandInInference", **overrides: Any) -> Topology:
    """The rollout worker and stand-in inference of test_rollout, plus ``target``."""
    base = topology(inference=inference, **overrides)
    sampler, infer, _collector = base.processes
    processes = (sampler, infer,
                 ProcessSpec("downstream", (ActorSpec(target, target_class, _params(target_class,
                                                                                   sampler)),)))
    connections = tuple(c for c in base.connections if "collector" not in (c.source, c.target))
    connections += tuple(ConnectionSpec(*w) for w in wires)  # type: ignore[arg-type]
    return Topology("recovery-test", "<test>", processes, connections)


def _params(target_class: str, sampler: ProcessSpec) -> Any:
    if target_class.endswith(":Batcher"):
        return Batcher.Params()  # the batch's size is the rollout worker's, through the record
    return None


HOLDING = sampler_topology(
    "holder", f"{__name__}:HoldingBatcher",
    [("rollout", "trajectory_ready", "holder", "on_trajectory_ready", "broadcast"),
     ("holder", "slots_released", "rollout", "on_slots_released", "any")])


def audit(worker: Any) -> dict[str, int]:
    """The worker's slot audit now."""
    active = [split.slots for split in worker.splits if split.index not in worker.paused]
    return worker.faults.stages.audit(np.concatenate(active) if active else np.zeros(0, int))


def assert_exact(counts: dict[str, int]) -> None:
    """Every taken slot is accounted for, nothing is stale."""
    assert counts["untracked"] == counts["orphaned"] == counts["stray_filling"] == 0, counts
    assert counts["stale"] == 0, counts
    assert counts["taken"] == (counts["filling"] + counts["submitted"] + counts["queued"]
                               + counts["consumed"]), counts


async def test_restarted_worker_reclaims_its_slots_and_ignores_stale_releases() -> None:
    async with hosted(HOLDING, "ipc") as actors:
        worker, holder = actors["rollout"], actors["holder"]
        await wait_until(lambda: len(worker.paused) == 2)  # every slot is with the "batcher"
        # over ipc the last trajectories may still be on their way to the holder
        await wait_until(lambda: len(holder.held) == worker.pool.size)
        assert worker.faults.stages.reclaimed == 0  # a first start takes nothing back
        held = list(holder.held)
        assert len(held) == worker.pool.size and worker.pool.free == 0
        # Before the crash: the learner copied two slots but their release never arrived, and a
        # message of a third never reached the batcher (it is still marked submitted).
        consumed = holder.release(2, send=False)
        lost = holder.held.pop()
        worker.faults.stages.stage[lost] = SUBMITTED
        kept = list(holder.held)

        worker = (await restart(actors, "sampler"))["rollout"]
        assert worker.faults.stages.reclaimed == 3
        stage = worker.faults.stages.stage
        assert all(stage[s] == QUEUED for s in kept)
        assert worker.pool.in_use == len(kept) + worker.row_slots.size - worker.rows_per_split * \
            len(worker.paused)
        assert_exact(audit(worker))

        # A late release of a slot the new worker already took back is ignored, not a double
        # release.
        holder.slots_released.emit(SlotsReleased(0, (consumed[0],)), key=0)
        await wait_until(lambda: worker.faults.stages.stale_releases == 1)
        # The kept slots come back through the normal path, and sampling goes on.
        holder.release()
        await wait_until(lambda: len(holder.held) >= worker.pool.size // 2)
        holder.release()
        await wait_until(lambda: len(holder.held) >= 4)
        assert_exact(audit(worker))
        assert all(worker.faults.stages.stage[s] == QUEUED for s in holder.held)


async def test_batcher_restart_releases_what_it_held() -> None:
    topo = sampler_topology(
        "batcher", "sfbus_components.learning.batcher:Batcher",
        [("rollout", "trajectory_ready", "batcher", "on_trajectory_ready", "broadcast"),
         ("batcher", "batcher_started", "rollout", "on_batcher_started", "broadcast")])
    async with hosted(topo, "ipc") as actors:
        worker, batcher = actors["rollout"], actors["batcher"]
        await wait_until(lambda: len(worker.paused) == 2)  # no learner: everything is queued
        await wait_until(lambda: holdings(batcher) == worker.pool.size)
        assert batcher.slots.epoch == 0 and worker.faults.stages.reclaimed == 0
        held = holdings(batcher)
        old_slots = [s for b in batcher.queue for s in b.slots] + batcher.pending_slots

        batcher = (await restart(actors, "downstream"))["batcher"]
        assert batcher.slots.epoch == 1
        # released, sampling resumed
        await wait_until(lambda: worker.faults.stages.reclaimed == held)
        await wait_until(lambda: len(worker.paused) == 2)
        await wait_until(lambda: holdings(batcher) == worker.pool.size)
        counts = audit(worker)
        assert_exact(counts)
        assert counts["queued"] == worker.pool.size
        # A trajectory sent to the old batcher and delivered late is dropped, not batched.
        before = batcher.slots.dropped
        batcher.on_trajectory_ready(TrajectoryReady(0, old_slots[0], 0, epoch=0))
        assert batcher.slots.dropped == before + 1


def holdings(batcher: Batcher) -> int:
    """Trajectories a batcher holds."""
    return len(batcher.pending_slots) + sum(len(b.slots) for b in batcher.queue)


class ForgetfulInference(StandInInference):
    """Loses every split's first request (as a dying inference worker does), answers the rest."""

    async def on_start(self) -> None:
        """Also remember which splits lost one."""
        await super().on_start()
        self.forgot: set[int] = set()

    @slot
    def on_inference_requested(self, msg: InferenceRequest) -> None:
        """Drop the first request of each split."""
        if msg.split not in self.forgot:
            self.forgot.add(msg.split)
            return
        super().on_inference_requested(msg)


async def test_lost_inference_request_is_sent_again() -> None:
    topo = topology(inference="ForgetfulInference", inference_timeout_s=0.2)
    topo = _with_class(topo, "infer", f"{__name__}:ForgetfulInference")
    async with hosted(topo, "ipc") as actors:
        worker, collector = actors["rollout"], actors["collector"]
        await wait_until(lambda: len(collector.received) >= 2 * worker.row_slots.size, 10)
        assert worker.faults.requests_resent >= 2  # both splits' first requests were lost


class EchoingInference(StandInInference):
    """Holds requests; answers echo the request's number as the real inference worker does."""

    AUTO = False

    def answer(self, msg: InferenceRequest) -> None:
        """Write random actions for the request's rows; signal the worker with its number."""
        buf = self.buffers[msg.worker].numpy
        slots, ts = self.buffers[msg.worker].requests[msg.split, :msg.count].T
        buf["actions"][slots, ts] = self.rng.integers(0, self.heads[0], (msg.count, 1))
        self.actions_ready.emit(ActionsReady(msg.worker, msg.split, seq=msg.seq), key=msg.worker)


async def test_answer_to_a_request_sent_again_is_ignored() -> None:
    topo = _with_class(topology(inference_timeout_s=0.2), "infer",
                       f"{__name__}:EchoingInference")
    async with hosted(topo, "inproc") as actors:
        worker, inference = actors["rollout"], actors["inference"]
        # Nothing is answered: after a timeout both splits send their requests again.
        await wait_until(lambda: len(inference.pending) >= 4, 5)
        first, again = [m for m in inference.pending if m.split == 0][:2]
        assert again.seq > first.seq and (first.count, first.policy) == (again.count, again.policy)
        t = steps(worker)
        inference.pending.remove(first)
        inference.answer(first)  # the late answer to the first one
        await asyncio.sleep(0.05)
        assert steps(worker) == t and worker.faults.stale_answers == 1
        inference.answer_split(0)  # the newest request of split 0
        await wait_until(lambda: steps(worker)[0] == t[0] + 1)
        await asyncio.sleep(0.05)
        assert steps(worker)[0] == t[0] + 1


def _with_class(topo: Topology, process: str, class_path: str) -> Topology:
    procs = tuple(ProcessSpec(p.name, tuple(ActorSpec(a.name, class_path, a.params)
                                            for a in p.actors)) if p.name == process else p
                  for p in topo.processes)
    return Topology(topo.name, topo.path, procs, topo.connections)


def test_learner_marks_only_downstream_slots_consumed() -> None:
    stage = np.array([0, 1, SUBMITTED, QUEUED, CONSUMED], np.uint8)
    slots = LearnerSlots.__new__(LearnerSlots)
    slots.stages = [stage]
    slots.torn_batches = 0
    slots.log = logging.getLogger(__name__)
    slots.consume({0: [0, 1, 2, 3, 4]})
    assert stage.tolist() == [0, 1, CONSUMED, CONSUMED, CONSUMED]
    assert slots.torn({0: [1, 2]}) and not slots.torn({0: [0, 2, 3]})
