"""The sampling modes alone: one split driven step by step, with no actor, bus or process.

A split of each mode is built over plain arrays standing in for shared memory, answered by a
few lines of stand-in inference, and checked against replays of its envs.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from sfbus_components.datapath.buffers import TrajectoryBuffer, TrajectoryLayout
from sfbus_components.datapath.messages import EpisodeFinished, InferenceRequest
from sfbus_components.envs import env_spec, make_env
from sfbus_components.sampling.batched_layout import BatchedSplit
from sfbus_components.sampling.policy_mapping import (
    AgentPolicies,
    RoundRobinMapping,
    trajectory_owners,
)
from sfbus_components.sampling.rollout_params import RolloutParams
from sfbus_components.sampling.splits import NonBatchedSplit, PopulationSplit, Split, SplitWiring
from sfbus_components.sampling.worker_envs import WorkerEnvs, env_seed

T, SEED, POLICIES = 4, 5, 3
ENV, KWARGS = "toy_multi_agent", {"episode_length": 3}  # 2 agents; episodes end inside slots
SPLIT = 1  # the split driven: rows 4..7 of the worker, envs 2 and 3


class Memory:
    """Plain arrays standing in for a run's shared memory (what TrajectoryBuffer attaches)."""

    def __init__(self, layout: TrajectoryLayout) -> None:
        self.arrays = {s.name: np.zeros(s.shape, s.dtype) for s in layout.array_specs("w")}

    def shared(self, name: str) -> Any:
        """The array ``name`` as numpy and torch views."""
        array = self.arrays[name]
        return SimpleNamespace(numpy=array, torch=torch.from_numpy(array))


class Harness:
    """Split ``SPLIT`` of a worker in ``mode``, the requests it emits, the episodes it reports."""

    def __init__(self, mode: str, env: str = ENV, kwargs: dict[str, Any] = KWARGS) -> None:
        params = RolloutParams(env=env, env_kwargs=kwargs, rollout=T, num_envs=4, num_splits=2,
                               batch_size=4 * T, seed=SEED, env_step_timeout_s=0, policy=1,
                               sampling="batched" if mode == "batched" else "non_batched",
                               num_policies=POLICIES if mode == "population" else 1)
        spec = env_spec(env, **kwargs)
        self.na = na = spec.num_agents
        rows = 2 * na
        layout = TrajectoryLayout(spec, T, 4, 3 * rows, 2, rows,
                                  rows if mode == "batched" else 0)
        self.buffer = TrajectoryBuffer(Memory(layout), "w", layout)  # type: ignore[arg-type]
        self.population = (AgentPolicies(RoundRobinMapping(POLICIES), POLICIES, 4, na, 2)
                           if mode == "population" else None)
        agent_policy = (self.population.policy if self.population is not None
                        else np.full(4 * na, params.policy, np.int64))
        envs = WorkerEnvs(params, "w", 0, 0, na, agent_policy, logging.getLogger(__name__),
                          self.fail)
        self.requests: list[tuple[InferenceRequest, int | None]] = []
        self.episodes: list[EpisodeFinished] = []
        wiring = SplitWiring(0, params.policy, self.buffer, np.zeros(4 * na, np.int64),
                             agent_policy, envs, self.emit, self.episodes.append)
        self.split: Split = (
            BatchedSplit(SPLIT, wiring) if mode == "batched"
            else PopulationSplit(SPLIT, wiring, self.population) if self.population is not None
            else NonBatchedSplit(SPLIT, wiring))
        other = [spec.empty_obs() for _ in range(2)]  # split 0's envs: not driven here
        envs.create(other + self.split.vector.rows_of(self.split.carry_obs))
        self.replays = [make_env(env, **kwargs) for _ in range(2)]
        self.expected = {"obs": np.zeros((rows, 4), np.float32)}  # the replays' observations
        for i, replay in enumerate(self.replays):
            replay.reset_into({"obs": self.expected["obs"][i * na:(i + 1) * na]},
                              seed=env_seed(SEED, 0, 2 + i))
        self.rng = np.random.default_rng(0)
        self.choices = spec.action_heads[0]
        self.time_outs = self.terminations = 0
        """Time-outs and terminations the split stored."""

    def fail(self, reason: str) -> Any:
        raise AssertionError(reason)

    def emit(self, payload: Any, *, key: int | None = None) -> None:
        self.requests.append((payload, key))

    def answer(self, request: InferenceRequest) -> None:
        """Write random actions and a marked next state into the rows the request names."""
        if request.block >= 0:
            slots = np.arange(request.block, request.block + request.count)
            ts = np.full(request.count, request.t)
        else:
            slots, ts = self.buffer.requests[request.split,
                                             request.offset:request.offset + request.count].T
        fields = self.buffer.numpy
        fields["actions"][self.buffer.at(slots, ts)] = self.rng.integers(0, self.choices,
                                                                         (len(slots), 1))
        fields["rnn"][self.buffer.at(slots, ts + 1)] = 0.5 + ts[:, None]

    def step_and_check(self) -> None:
        """Request, answer, step; compare every row with the replayed envs."""
        split, buffer, fields, na = self.split, self.buffer, self.buffer.numpy, self.na
        t = split.t
        sent = len(self.requests)
        split.request(seq=7)
        for request, _ in self.requests[sent:]:
            self.answer(request)
        assert split.awaiting == len(self.requests) - sent
        acting = split.policies.copy()
        split.step()
        assert split.t == t + 1
        at, at1 = buffer.at(split.slots, t), buffer.at(split.slots, t + 1)
        actions = fields["actions"][at]
        for i, replay in enumerate(self.replays):
            rows = slice(i * na, (i + 1) * na)
            r, term, trunc, _ = replay.step_into(actions[rows], {"obs": self.expected["obs"][rows]})
            assert np.array_equal(fields["rewards"][at][rows], r)
            assert np.array_equal(fields["dones"][at][rows], term | trunc)
            assert np.array_equal(fields["time_outs"][at][rows], trunc & ~term)
            self.time_outs += int(fields["time_outs"][at][rows].sum())
            self.terminations += int(term.sum())
        assert np.array_equal(fields["obs.obs"][at1], self.expected["obs"])
        done = fields["dones"][at].astype(bool)
        assert np.array_equal(fields["rnn"][at1][:, 0], np.where(done, 0.0, 0.5 + t))
        if self.population is not None:
            assert np.array_equal(fields["policies"][at], acting)  # who acted, not who acts next

    def run_slot(self, fresh: np.ndarray) -> list[int]:
        """Fill ``fresh`` for T steps; returns the policies the split hands its slots to."""
        carried = self.split.carry_obs["obs"].copy()
        self.split.start(fresh)
        assert np.array_equal(self.buffer.numpy["obs.obs"][self.buffer.at(fresh, 0)], carried)
        for _ in range(T):
            self.step_and_check()
        return self.split.finish()


@pytest.mark.parametrize("mode", ["non_batched", "batched", "population"])
def test_a_split_alone_fills_its_slots_like_its_replayed_envs(mode: str) -> None:
    h = Harness(mode)
    rows = h.split.rows
    blocks = [np.arange(8, 12), np.arange(0, 4)]  # whole blocks, valid in every layout
    owners = [h.run_slot(fresh) for fresh in blocks]

    # Episodes of 3 steps: every agent of both envs finished two, reported with its policy,
    # each cut by the time limit (stored as a time-out, not a termination).
    assert len(h.episodes) == 2 * rows == h.time_outs
    assert all(e.length == 3 for e in h.episodes)
    requests = [r for r, _ in h.requests]
    assert all(r.worker == 0 and r.split == SPLIT and r.seq == 7 for r in requests)
    if mode == "non_batched":
        assert all((r.count, r.policy, r.block, r.offset) == (rows, 1, -1, 0) for r in requests)
        assert owners == [[1] * rows] * 2
        assert (h.buffer.numpy["policies"][blocks[1]] == 1).all()
    elif mode == "batched":
        assert [(r.block, r.t) for r in requests] == [(8, t) for t in range(T)] + [
            (0, t) for t in range(T)]
        assert all((r.count, r.policy) == (rows, 1) for r in requests)
        assert owners == [[1] * rows] * 2
    else:
        # One request per policy acting, keyed by it; together they cover the split's rows.
        assert all(key == r.policy for r, key in h.requests)
        assert sum(r.count for r in requests) == 2 * T * rows
        assert len(requests) > 2 * T  # agents of a split act with different policies
        for fresh, owner in zip(blocks, owners, strict=True):
            acted = h.buffer.numpy["policies"][fresh, :T]
            assert owner == trajectory_owners(acted, POLICIES).tolist()
        assert {e.policy for e in h.episodes} <= set(range(POLICIES))


@pytest.mark.parametrize("mode", ["non_batched", "batched"])
def test_a_gymnasium_time_limit_is_stored_as_a_time_out_and_a_failure_is_not(mode: str) -> None:
    # CartPole under random actions falls within ~10-30 steps (terminated) or reaches the
    # 12-step limit (truncated): both kinds of done, told apart in the buffer.
    h = Harness(mode, "gym:CartPole-v1", {"max_episode_steps": 12})
    blocks = [np.arange(2, 4), np.arange(0, 2), np.arange(4, 6)]  # whole blocks of 2 rows
    for _ in range(10):
        for fresh in blocks:
            h.run_slot(fresh)
    assert h.time_outs > 0 and h.terminations > 0
