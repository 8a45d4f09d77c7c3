"""The batcher groups trajectories in arrival order, queues full batches, and waits for idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from sfbus import Signal, slot
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology
from sfbus_components.datapath.messages import BatchReady, LearnerIdle, TrajectoryReady
from sfbus_components.datapath.record import TrajectoryWriter
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.learning.batcher import Batcher
from sfbus_components.models import ModelConfig
from tests.kernel.conftest import hosted

DATA = DataPathParams(env="gym:CartPole-v1", rollout=8, batch_size=24, num_envs=2,
                      model=ModelConfig(core="none", mlp_layers=(8,)))
"""The run's data path: 3 trajectories per batch."""


class Feeder(TrajectoryWriter):
    """Stands in for the rollout workers (it is the run's rollout actor, whose parameters size
    the data-path record; it keeps no trajectory buffer) and the learner around a batcher."""

    Params = DataPathParams

    trajectory_ready = Signal(TrajectoryReady)
    learner_idle = Signal(LearnerIdle)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[BatchReady] = []

    @slot
    def on_batch_ready(self, msg: BatchReady) -> None:
        """Record a batch the batcher sent."""
        self.batches.append(msg)


def topology() -> Topology:
    """A feeder wired to a batcher of policy 0 with 3 trajectories per batch."""
    return Topology("batcher", "<test>", (
        ProcessSpec("feed", (ActorSpec("feeder", "tests.components.learning.test_batcher:Feeder",
                                       DATA),)),
        ProcessSpec("batch", (ActorSpec("batcher",
                "sfbus_components.learning.batcher:Batcher", Batcher.Params(policy=0)),)),
    ), (
        ConnectionSpec("feeder", "trajectory_ready", "batcher", "on_trajectory_ready"),
        ConnectionSpec("feeder", "learner_idle", "batcher", "on_learner_idle"),
        ConnectionSpec("batcher", "batch_ready", "feeder", "on_batch_ready"),
    ))


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until ``condition()`` holds (messages take a few loop turns, or a socket hop)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.002)


@pytest.mark.parametrize("transport", ["inproc", "ipc"])
async def test_groups_queues_and_waits_for_idle(transport):
    async with hosted(topology(), transport) as actors:
        feeder: Feeder = actors["feeder"]
        batcher: Batcher = actors["batcher"]
        # 7 trajectories of policy 0, interleaved with 2 of policy 1
        for i in range(7):
            feeder.trajectory_ready.emit(TrajectoryReady(worker=i % 2, slot=i, policy=0))
            if i in (2, 4):
                feeder.trajectory_ready.emit(TrajectoryReady(worker=5, slot=99, policy=1))
        await until(lambda: batcher.ignored == 2 and len(batcher.pending_slots) == 1)
        assert len(batcher.queue) == 2
        await asyncio.sleep(0.05)
        assert feeder.batches == []  # the learner has not said it is idle

        feeder.learner_idle.emit(LearnerIdle(policy=0))
        await until(lambda: len(feeder.batches) == 1)
        assert feeder.batches[0] == BatchReady(policy=0, workers=(0, 1, 0), slots=(0, 1, 2))

        feeder.learner_idle.emit(LearnerIdle(policy=1))  # another policy's learner
        await asyncio.sleep(0.05)
        assert len(feeder.batches) == 1

        feeder.learner_idle.emit(LearnerIdle(policy=0))
        await until(lambda: len(feeder.batches) == 2)
        assert feeder.batches[1] == BatchReady(policy=0, workers=(1, 0, 1), slots=(3, 4, 5))

        # idle with nothing queued: the next batch goes out as soon as it completes
        feeder.learner_idle.emit(LearnerIdle(policy=0))
        await until(lambda: batcher.learner_idle)
        for i in (7, 8):
            feeder.trajectory_ready.emit(TrajectoryReady(worker=i % 2, slot=i, policy=0))
        await until(lambda: len(feeder.batches) == 3)
        assert feeder.batches[2] == BatchReady(policy=0, workers=(0, 1, 0), slots=(6, 7, 8))
        assert not batcher.learner_idle and not batcher.queue and not batcher.pending_slots
        assert batcher.ignored == 2
