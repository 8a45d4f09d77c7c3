"""Several policies through a real rollout worker and a real inference worker serving them all."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from sfbus import Actor, Signal, slot
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology
from sfbus_components.datapath.messages import HyperparamsChanged, InferenceRequest
from sfbus_components.envs import register_env
from sfbus_components.envs.multi_agent import ToyMultiAgentEnv
from sfbus_components.models import ModelConfig
from sfbus_components.sampling.inference_worker import InferenceWorker
from sfbus_components.sampling.policy_mapping import trajectory_owners
from sfbus_components.sampling.rollout_worker import RolloutParams
from tests.components.sampling.test_rollout import SAMPLER_WIRES, wait_until
from tests.kernel.conftest import TRANSPORTS, hosted

T = 16
POLICIES = 3


class MarkedInference(InferenceWorker):
    """The real inference worker whose policy ``p`` values every row at ``p``; logs requests."""

    async def on_start(self) -> None:
        """Build the policies, then make each one's value output its id."""
        await super().on_start()
        self.requests: list[tuple[InferenceRequest, np.ndarray]] = []
        for policy, served in self.served.items():
            with torch.no_grad():
                served.model.model.critic.weight.zero_()
                served.model.model.critic.bias.fill_(policy)

    @slot
    def on_inference_requested(self, request: InferenceRequest) -> None:
        """Record the request's rows, then serve it."""
        table = self.rows[request.worker].requests[request.split]
        self.requests.append((request, table[request.offset:request.offset + request.count]
                              .copy()))
        super().on_inference_requested(request)


class ShapedEnv(ToyMultiAgentEnv):
    """The toy env with one agent and a reward-shaping table, as the Doom env has."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(num_agents=1, **kwargs)
        self.reward_shaping = {"bonus": 0.0}


register_env("test_shaped", ShapedEnv)


class FakePbt(Actor):
    """Sends hyperparameter changes for the test."""

    hyperparams_changed = Signal(HyperparamsChanged)


class CountingInference(MarkedInference):
    """The marked inference worker whose policies' weights versions go up by one at every pass
    (a learner publishing between any two passes)."""

    def _serve_policy(self, served: Any, requests: list[InferenceRequest]) -> None:
        served.version += 1
        super()._serve_policy(served, requests)


def topology(env: str = "gym:CartPole-v1", inference: str = "MarkedInference",
             **overrides: Any) -> Topology:
    """Rollout worker, the marked inference worker and the rollout test's collector."""
    params = RolloutParams(env=env, rollout=T, num_envs=4, num_splits=2, batch_size=4 * T,
                           model=ModelConfig(core="none", mlp_layers=(8,)), seed=5,
                           num_policies=POLICIES)
    params = replace(params, **overrides)
    here, rollout_tests = __name__, "tests.components.sampling.test_rollout"
    processes = (
        ProcessSpec("sampler", (ActorSpec("rollout",
                "sfbus_components.sampling.rollout_worker:RolloutWorker",
                                          params),)),
        ProcessSpec("infer", (ActorSpec("inference", f"{here}:{inference}",
                                        InferenceWorker.Params(device="cpu")),)),
        ProcessSpec("collect", (ActorSpec("collector", f"{rollout_tests}:StandInCollector",
                                          None),
                                ActorSpec("pbt", f"{here}:FakePbt", None))),
    )
    wires = [*SAMPLER_WIRES,
             ("pbt", "hyperparams_changed", "rollout", "on_hyperparams_changed", "broadcast")]
    return Topology("multi-policy-test", "<test>", processes,
                    tuple(ConnectionSpec(*w) for w in wires))  # type: ignore[arg-type]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_each_step_is_acted_by_its_agents_policy(transport: str) -> None:
    async with hosted(topology(), transport) as actors:
        worker, inference, collector = actors["rollout"], actors["inference"], actors["collector"]
        await wait_until(lambda: len(collector.received) >= 48, timeout=30)
        requests = list(inference.requests)

    # Every step's value is the id of the policy whose network acted: the id recorded for it.
    mixed = 0
    for msg, traj in zip(collector.received, collector.trajectories, strict=True):
        acted = traj["policies"][:T]
        assert np.array_equal(traj["values"][:T], acted.astype(np.float32))
        assert msg.policy == trajectory_owners(acted[None], POLICIES)[0]
        mixed += len(set(acted.tolist())) > 1
    assert mixed, "no agent switched policy inside a trajectory"
    assert {m.policy for m in collector.episodes} == set(range(POLICIES))

    # A split asks once per policy acting in it; the groups tile its rows without overlap.
    rounds: list[list[tuple[InferenceRequest, np.ndarray]]] = []
    filling: dict[int, list[tuple[InferenceRequest, np.ndarray]]] = {}
    for request, rows in requests:
        group = filling.setdefault(request.split, [])
        group.append((request, rows))
        if sum(r.count for r, _ in group) == worker.rows_per_split:
            rounds.append(filling.pop(request.split))
    assert any(len(group) > 1 for group in rounds)
    for group in rounds:
        assert len({r.policy for r, _ in group}) == len(group)
        assert sorted(r.offset for r, _ in group) == [
            sum(r.count for r, _ in sorted(group, key=lambda g: g[0].offset)[:i])
            for i in range(len(group))]
        assert sum(r.count for r, _ in group) == worker.rows_per_split
        assert len({tuple(row) for _, rows in group for row in rows}) == worker.rows_per_split


async def test_reward_shaping_follows_the_agents_policy() -> None:
    topo = topology(env="test_shaped", env_kwargs={"episode_length": 3},
                    policy_mapping="sfbus_components.sampling.policy_mapping:RoundRobinMapping")
    async with hosted(topo) as actors:
        worker, pbt, collector = actors["rollout"], actors["pbt"], actors["collector"]
        for policy in range(POLICIES):
            pbt.hyperparams_changed.emit(HyperparamsChanged(
                policy, ("appo.lr", "reward_shaping.bonus"), (1.0, 10.0 + policy)))
        await wait_until(lambda: len(worker.envs.shaping) == POLICIES)
        for _ in range(3):  # episodes of 3 steps: policies rotate at every episode start
            seen = len(collector.episodes)
            await wait_until(lambda seen=seen: len(collector.episodes) >= seen + 8)
            for e, env in enumerate(worker.envs.envs):
                assert env.reward_shaping == {"bonus": 10.0 + worker.agent_policy[e]}


async def test_a_match_reports_its_opponents_versions_at_its_first_and_last_step() -> None:
    # Versions go up at every pass of a policy, and with one split every step of a match is one
    # pass of its opponent's policy: a match of 8 rounds spans exactly 7 versions of it.
    rounds = 8
    topo = topology(env="sfbus_components.envs.matrix_game:make_matrix_game",
                    inference="CountingInference", env_kwargs={"rounds": rounds}, num_envs=2,
                    num_splits=1, batch_size=4 * T)
    async with hosted(topo) as actors:
        collector = actors["collector"]
        await wait_until(lambda: len(collector.episodes) >= 24, timeout=30)
        matches = [e for e in collector.episodes if e.opponent >= 0]
    assert len(matches) >= 24
    for match in matches:
        first, last = match.opponent_versions
        assert match.length == rounds
        assert first > 0 and last - first == rounds - 1, match
