"""The rollout worker against a stand-in inference worker and collector, over both transports."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import pytest

from sfbus import Actor, Signal, slot
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology
from sfbus_components.datapath.buffers import TrajectoryBuffer
from sfbus_components.datapath.messages import (
    ActionsReady,
    EpisodeFinished,
    InferenceRequest,
    SlotsReleased,
    TrajectoryReady,
)
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.envs import EnvError, make_env
from sfbus_components.envs.multi_agent import ToyMultiAgentEnv
from sfbus_components.models import ModelConfig
from sfbus_components.sampling.rollout_worker import RolloutParams
from sfbus_components.sampling.worker_envs import env_seed
from tests.kernel.conftest import TRANSPORTS, hosted

T = 8
SEED = 3


def rnn_marker(t: int) -> float:
    """What the stand-in writes as the state at step ``t`` (never zero)."""
    return 0.5 + t


class StandInInference(Actor):
    """Answers requests with random actions and a recognisable next state; or holds them."""

    Params = DataPathParams
    records = (DataPath,)
    AUTO: ClassVar[bool] = True
    actions_ready = Signal(ActionsReady)

    async def on_start(self) -> None:
        """Attach every worker's buffer."""
        data_path = self.context.records[DataPath]
        self.heads = data_path.spec.action_heads
        self.buffers = [TrajectoryBuffer(self.context, name, data_path.layout)
                        for name in data_path.workers]
        self.rng = np.random.default_rng(0)
        self.auto = type(self).AUTO
        self.pending: deque[InferenceRequest] = deque()
        self.log: list[tuple[int, np.ndarray]] = []  # (split, [(slot, t)] rows) per request

    @slot
    def on_inference_requested(self, msg: InferenceRequest) -> None:
        """Record the request; answer it now in auto mode."""
        rows = self.buffers[msg.worker].requests[msg.split, :msg.count].copy()
        self.log.append((msg.split, rows))
        if self.auto:
            self.answer(msg)
        else:
            self.pending.append(msg)

    def answer(self, msg: InferenceRequest) -> None:
        """Write actions, versions and the next state for the request's rows; signal the worker."""
        buf = self.buffers[msg.worker].numpy
        slots, ts = self.buffers[msg.worker].requests[msg.split, :msg.count].T
        buf["actions"][slots, ts] = np.stack(
            [self.rng.integers(0, n, msg.count) for n in self.heads], axis=1)
        buf["versions"][slots, ts] = 7
        buf["rnn"][slots, ts + 1] = rnn_marker(ts + 1)[:, None]
        self.actions_ready.emit(ActionsReady(msg.worker, msg.split), key=msg.worker)

    def answer_split(self, split: int) -> None:
        """Answer the held request of ``split``."""
        msg = next(m for m in self.pending if m.split == split)
        self.pending.remove(msg)
        self.answer(msg)


class HoldingInference(StandInInference):
    """The stand-in, holding every request until the test answers it."""

    AUTO = False


class StandInCollector(Actor):
    """Copies every finished trajectory out of shared memory, then (optionally) releases it."""

    records = (DataPath,)
    RELEASE: ClassVar[bool] = True
    slots_released = Signal(SlotsReleased)

    async def on_start(self) -> None:
        """Attach the worker's buffer."""
        self.buffer = TrajectoryBuffer(self.context, "rollout",
                                       self.context.records[DataPath].layout)
        self.release = type(self).RELEASE
        self.received: list[TrajectoryReady] = []
        self.trajectories: list[dict[str, np.ndarray]] = []
        self.held: list[int] = []
        self.episodes: list[EpisodeFinished] = []

    @slot
    def on_trajectory_ready(self, msg: TrajectoryReady) -> None:
        """Snapshot the slot; release it unless told to hold."""
        self.received.append(msg)
        at = self.buffer.at(msg.slot, slice(None))
        self.trajectories.append({k: v[at].copy() for k, v in self.buffer.numpy.items()})
        if self.release:
            self.slots_released.emit(SlotsReleased(msg.worker, (msg.slot,)), key=msg.worker)
        else:
            self.held.append(msg.slot)

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Record an episode."""
        self.episodes.append(msg)

    def release_held(self, count: int | None = None) -> None:
        """Give back the ``count`` latest held slots (default: all)."""
        count = len(self.held) if count is None else count
        self.slots_released.emit(SlotsReleased(0, tuple(self.held[-count:])), key=0)
        del self.held[-count:]


class HoldingCollector(StandInCollector):
    """The collector, holding slots until the test releases them."""

    RELEASE = False


# Rollout worker <-> inference <-> collector: the wiring of every sampler test topology.
SAMPLER_WIRES = (
    ("rollout", "inference_requested", "inference", "on_inference_requested", "any"),
    ("inference", "actions_ready", "rollout", "on_actions_ready", "any"),
    ("rollout", "trajectory_ready", "collector", "on_trajectory_ready", "broadcast"),
    ("rollout", "episode_finished", "collector", "on_episode_finished", "broadcast"),
    ("collector", "slots_released", "rollout", "on_slots_released", "any"),
)


def topology(inference: str = "StandInInference", collector: str = "StandInCollector",
             **overrides: Any) -> Topology:
    """Rollout worker, stand-in inference and collector, one process each."""
    params = RolloutParams(env="gym:CartPole-v1", rollout=T, num_envs=4, num_splits=2,
                           batch_size=4 * T, model=ModelConfig(core_size=4), seed=SEED)
    params = replace(params, **overrides)
    data = DataPathParams(**{k: getattr(params, k)
                             for k in DataPathParams.__dataclass_fields__})
    here = __name__
    processes = (
        ProcessSpec("sampler", (ActorSpec("rollout",
                "sfbus_components.sampling.rollout_worker:RolloutWorker",
                                          params),)),
        ProcessSpec("infer", (ActorSpec("inference", f"{here}:{inference}", data),)),
        ProcessSpec("collect", (ActorSpec("collector", f"{here}:{collector}", None),)),
    )
    return Topology("rollout-test", "<test>", processes,
                    tuple(ConnectionSpec(*w) for w in SAMPLER_WIRES))  # type: ignore[arg-type]


def steps(worker: Any) -> list[int]:
    """The step each split of ``worker`` is at."""
    return [split.t for split in worker.splits]


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` on the loop until it holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.001)


def rows_by_trajectory(inference: StandInInference, collector: StandInCollector,
                       rows_per_split: int) -> dict[int, list[dict[str, np.ndarray]]]:
    """Each agent row's snapshotted trajectories, in order (slots are reused, so match by order)."""
    assigned: dict[int, deque[int]] = defaultdict(deque)
    for split, rows in inference.log:
        for i, (slot_, t) in enumerate(rows.tolist()):
            if t == 0:
                assigned[slot_].append(split * rows_per_split + i)
    per_row: dict[int, list[dict[str, np.ndarray]]] = defaultdict(list)
    for msg, traj in zip(collector.received, collector.trajectories, strict=True):
        per_row[assigned[msg.slot].popleft()].append(traj)
    return per_row


def check_replay(env: str, env_kwargs: dict[str, Any], per_row: dict[int, list[dict]],
                 na: int, trajectories: int, policy: int = 0) -> int:
    """Replay each env of worker 0 with the recorded actions; every row must match step by step.
    Returns the time-outs (truncations, not terminations) seen."""
    time_outs = 0
    for e in range(4):
        rows = range(e * na, (e + 1) * na)
        replay = make_env(env, **env_kwargs)
        expected = replay.spec.empty_obs()
        replay.reset_into(expected, seed=env_seed(SEED, 0, e))
        state = np.zeros((na, 4), np.float32)
        for k in range(trajectories):
            trajs = [per_row[r][k] for r in rows]
            for t in range(T):
                assert np.array_equal(np.stack([x["obs.obs"][t] for x in trajs]), expected["obs"])
                assert np.array_equal(np.stack([x["rnn"][t] for x in trajs]), state)
                actions = np.stack([x["actions"][t] for x in trajs])
                rewards, term, trunc, _ = replay.step_into(actions, expected)
                assert np.array_equal([x["rewards"][t] for x in trajs], rewards)
                done = term | trunc
                assert np.array_equal([x["dones"][t] for x in trajs], done)
                assert np.array_equal([x["time_outs"][t] for x in trajs], trunc & ~term)
                time_outs += int((trunc & ~term).sum())
                assert all(x["policies"][t] == policy and x["versions"][t] == 7 for x in trajs)
                # State after a done is zeroed; otherwise it is what inference wrote.
                state = np.where(done[:, None], 0.0, np.full((na, 4), rnn_marker(t + 1),
                                                             np.float32))
            assert np.array_equal(np.stack([x["obs.obs"][T] for x in trajs]), expected["obs"])
            assert np.array_equal(np.stack([x["rnn"][T] for x in trajs]), state)
    return time_outs


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("env, env_kwargs", [("gym:CartPole-v1", {}),
                                              ("gym:CartPole-v1", {"max_episode_steps": 5}),
                                              ("toy_multi_agent", {"episode_length": 5})])
async def test_trajectories_match_a_replayed_env(transport: str, env: str,
                                                 env_kwargs: dict[str, Any]) -> None:
    policy = 2  # not 0, what fresh shared memory holds: the worker must write it
    topo = topology(env=env, env_kwargs=env_kwargs, policy=policy)
    async with hosted(topo, transport) as actors:
        worker, inference, collector = actors["rollout"], actors["inference"], actors["collector"]
        agents = 4 * worker.num_agents
        await wait_until(lambda: len(collector.received) >= 3 * agents)
        per_row = rows_by_trajectory(inference, collector, worker.rows_per_split)
        # Auto mode answers at once, so the splits take turns step by step.
        splits = [s for s, _ in inference.log]
        assert splits[:12] == [0, 1] * 6

    time_outs = check_replay(env, env_kwargs, per_row, worker.num_agents, trajectories=3,
                             policy=policy)
    # A 5-step limit cuts episodes inside the trajectories: stored as time-outs.
    assert (time_outs > 0) == (env_kwargs != {})
    if env == "toy_multi_agent":
        assert collector.episodes
        assert all(m.length == 5 and m.frames == 5 and m.policy == policy
                   for m in collector.episodes)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_double_buffered_order(transport: str) -> None:
    async with hosted(topology("HoldingInference"), transport) as actors:
        worker, inference = actors["rollout"], actors["inference"]
        obs = worker.buffer.numpy["obs.obs"]
        await wait_until(lambda: len(inference.pending) == 2)  # each split asks for t = 0
        base = [0, 0]
        split1 = worker.row_slots[2:].copy()
        before = obs[split1, base[1] + 1].copy()
        inference.answer_split(0)
        await wait_until(lambda: len(inference.pending) == 2)
        assert steps(worker) == [base[0] + 1, base[1]]  # split 0 stepped, split 1 still waits
        assert np.array_equal(obs[split1, base[1] + 1], before)
        inference.answer_split(0)  # split 0 does not wait for split 1
        await wait_until(lambda: len(inference.pending) == 2)
        assert steps(worker) == [base[0] + 2, base[1]]
        inference.answer_split(1)
        await wait_until(lambda: len(inference.pending) == 2)
        assert steps(worker) == [base[0] + 2, base[1] + 1]
        assert [s for s, _ in inference.log[-3:]] == [0, 0, 1]


async def test_a_split_asks_again_before_the_next_split_steps() -> None:
    # Both splits' actions arrive in one frame. Split 0's next request must leave before split 1
    # is stepped (two frames, not one), or the splits would move, and wait, in lockstep.
    async with hosted(topology("HoldingInference"), "ipc") as actors:
        inference = actors["inference"]
        infer = next(h for h in actors["_hosts"] if h.name == "infer")
        await wait_until(lambda: len(inference.pending) == 2)
        received, sent = infer.bus.counters.frames_received, infer.bus.counters.frames_sent
        inference.answer_split(0)
        inference.answer_split(1)
        await wait_until(lambda: len(inference.pending) == 2)
        assert infer.bus.counters.frames_sent - sent == 1
        assert infer.bus.counters.frames_received - received == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_back_pressure_pauses_and_resumes(transport: str) -> None:
    async with hosted(topology(collector="HoldingCollector"), transport) as actors:
        worker, inference, collector = actors["rollout"], actors["inference"], actors["collector"]
        size, rps = worker.pool.size, worker.rows_per_split
        # Every slot not held by an active row is handed out; then both splits stop.
        await wait_until(lambda: len(worker.paused) == 2)
        requests = len(inference.log)
        await asyncio.sleep(0.05)
        assert len(inference.log) == requests
        assert worker.pool.free < rps
        assert len(collector.received) == size - worker.pool.free
        assert len({m.slot for m in collector.received}) == len(collector.received)
        # Release split 1's last slots only: split 0 (first in line) resumes in them and fills
        # them again while split 1 still waits to carry its observations over from them.
        assert list(worker.paused) == [0, 1]
        collector.release_held(rps)
        await wait_until(lambda: list(worker.paused) == [1, 0])
        collector.release = True
        collector.release_held()
        await wait_until(lambda: len(collector.received) >= size + 3 * worker.row_slots.size)
        assert len(inference.log) > requests
        per_row = rows_by_trajectory(inference, collector, rps)
    check_replay("gym:CartPole-v1", {}, per_row, 1, trajectories=5)


async def test_sync_mode_pauses_until_the_batch_is_released() -> None:
    async with hosted(topology(collector="HoldingCollector", mode="sync"), "inproc") as actors:
        worker, collector = actors["rollout"], actors["collector"]
        assert worker.pool.size == 4  # one batch: a trajectory from each of the 4 agents
        for batch in (1, 2):  # (a count of trajectories is stable; "not paused" is fleeting)
            await wait_until(lambda n=4 * batch: len(collector.received) == n
                             and len(worker.paused) == 2)
            await asyncio.sleep(0.02)
            assert len(collector.received) == 4 * batch and worker.pool.free == 0
            collector.release_held()


class FlakyEnv(ToyMultiAgentEnv):
    """A one-agent toy env whose engine dies on its third step while ``failures`` lasts."""

    failures: ClassVar[int] = 0

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(num_agents=1, episode_length=100, seed=seed)
        self.steps = 0

    def step_into(self, actions: np.ndarray, obs_out: dict[str, np.ndarray]) -> Any:
        """Step, or fail on the third step."""
        self.steps += 1
        if self.steps == 3 and FlakyEnv.failures > 0:
            FlakyEnv.failures -= 1
            raise EnvError("engine died")
        return super().step_into(actions, obs_out)


async def test_env_error_recreates_the_env() -> None:
    FlakyEnv.failures = 1
    async with hosted(topology(env=f"{__name__}:FlakyEnv"), "inproc") as actors:
        worker, inference, collector = actors["rollout"], actors["inference"], actors["collector"]
        await wait_until(lambda: len(collector.received) >= 8)
        per_row = rows_by_trajectory(inference, collector, worker.rows_per_split)
    assert worker.envs.failures == 1
    first = per_row[0][0]  # env 0 takes the first third step
    assert first["dones"][:T].tolist() == [0, 0, 1] + [0] * (T - 3)
    assert np.all(first["rnn"][3] == 0)
    fresh = make_env(f"{__name__}:FlakyEnv")
    expected = fresh.spec.empty_obs()
    fresh.reset_into(expected, seed=env_seed(SEED, 0, 0, 1))
    assert np.array_equal(first["obs.obs"][3], expected["obs"][0])
    assert not collector.episodes  # the broken episode is dropped, not reported
