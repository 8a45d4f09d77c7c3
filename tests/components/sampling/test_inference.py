"""The inference worker against stand-in rollout workers and a stand-in learner, in-process."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import torch

from sfbus import Actor, ArraySpec, RunRecords, Signal, slot
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology
from sfbus_components.datapath.buffers import (
    PolicyWeights,
    TrajectoryBuffer,
    policy_array_specs,
)
from sfbus_components.datapath.messages import ActionsReady, InferenceRequest, WeightsUpdated
from sfbus_components.datapath.record import DataPath, TrajectoryWriter
from sfbus_components.datapath.settings import DataPathParams, build_policy
from sfbus_components.models import ModelConfig
from sfbus_components.models.policy import Policy
from sfbus_components.models.precision import onednn_has_bf16
from sfbus_components.sampling.inference_worker import InferenceWorker
from tests.devices import CUDA_ONLY, DEVICES
from tests.kernel.conftest import hosted

PARAMS = DataPathParams(env="gym:CartPole-v1", rollout=4, num_envs=8, num_splits=2, batch_size=8,
                        model=ModelConfig(core="gru", core_size=16, mlp_layers=(16,)))
HERE = "tests.components.sampling.test_inference"


class FakeRollout(TrajectoryWriter):
    """The data path's rollout actor: writes observations and states into chosen rows, requests
    actions, records the answers."""

    Params = DataPathParams
    records = (DataPath,)
    inference_requested = Signal(InferenceRequest)

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """This worker's trajectory buffer and request table."""
        return records[DataPath].layout.array_specs(name)

    async def on_start(self) -> None:
        """Attach the buffer and fill every field the inference worker writes with sentinels."""
        layout = self.context.records[DataPath].layout
        self.buffer = TrajectoryBuffer(self.context, self.name, layout)
        actions_sentinel = np.nan if layout.spec.is_continuous else -1
        for name, value in (("rnn", np.nan), ("actions", actions_sentinel), ("log_probs", np.nan),
                            ("action_params", np.nan), ("values", np.nan), ("versions", -1)):
            self.buffer.numpy[name][...] = value
        self.answers: list[ActionsReady] = []
        self.answered = asyncio.Event()

    def request(self, split: int, rows: list[tuple[int, int]], seed: int) -> None:
        """Write distinctive observations and states into ``rows`` and ask for their actions."""
        rng = np.random.default_rng(seed)
        obs, rnn = self.buffer.numpy["obs.obs"], self.buffer.numpy["rnn"]
        for i, (s, t) in enumerate(rows):
            obs[s, t] = rng.normal(size=obs.shape[2:]) * 3
            rnn[s, t] = rng.normal(size=rnn.shape[2:])
            self.buffer.requests[split, i] = (s, t)
        self.answered.clear()
        self.inference_requested.emit(
            InferenceRequest(self.context.replica, split, len(rows), 0))

    @slot
    def on_actions_ready(self, msg: ActionsReady) -> None:
        """Record an answer."""
        self.answers.append(msg)
        self.answered.set()

    async def wait(self, n: int) -> None:
        """Wait until ``n`` answers came in."""
        async with asyncio.timeout(10):
            while len(self.answers) < n:
                self.answered.clear()
                await self.answered.wait()


class FakeLearner(Actor):
    """Owns the published weights of policy 0 and announces new versions."""

    Params = DataPathParams
    records = (DataPath,)
    weights_updated = Signal(WeightsUpdated)

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """The weights vector and its seqlock counter."""
        return policy_array_specs(0, records[DataPath].weights_size(0))

    def publish(self, policy: Policy, version: int, announce: bool) -> None:
        """Publish ``policy`` as ``version``, signalling the inference workers if ``announce``."""
        PolicyWeights(self.context, 0).publish(policy.published_tensors(), version)
        if announce:
            self.weights_updated.emit(WeightsUpdated(0, version))


@asynccontextmanager
async def run(params: DataPathParams = PARAMS, learner: bool = True, transport: str = "inproc",
              device: str = "cpu", **inference: Any) -> AsyncIterator[dict]:
    """Two stand-in rollout workers, an inference worker (on ``device``: tests that do not
    name one check the CPU's exact arithmetic) and maybe a learner."""
    iparams = InferenceWorker.Params(device=device, **inference)
    processes = [
        ProcessSpec("rollout", (ActorSpec("rollout", f"{HERE}:FakeRollout", params),), 2),
        ProcessSpec("inference", (ActorSpec("inference",
                "sfbus_components.sampling.inference_worker:InferenceWorker",
                                            iparams),)),
    ]
    connections = [
        ConnectionSpec("rollout", "inference_requested", "inference", "on_inference_requested",
                       "any"),
        ConnectionSpec("inference", "actions_ready", "rollout", "on_actions_ready", "any"),
    ]
    if learner:
        processes.append(ProcessSpec("learner", (ActorSpec("learner", f"{HERE}:FakeLearner",
                                                           params),)))
        connections.append(ConnectionSpec("learner", "weights_updated", "inference",
                                          "on_weights_updated"))
    async with hosted(Topology("test", "<test>", tuple(processes), tuple(connections)),
                      transport) as actors:
        yield actors


def trained_policy(seed: int, params: DataPathParams = PARAMS) -> Policy:
    """A policy with its own weights and non-trivial observation statistics."""
    torch.manual_seed(seed)
    policy = build_policy(params)
    shape = policy.obs_normalizer.stats["obs"].shape
    seen = torch.randn(64, *shape) * 2 + 1 if len(shape) == 1 \
        else torch.randint(0, 256, (64, *shape), dtype=torch.uint8)
    policy.obs_normalizer({"obs": seen})  # train mode: updates stats
    for param in policy.model.actor.parameters():
        param.data.normal_()  # far from uniform, so different weights give different actions
    return policy.eval()


def as_served(actors: dict, params: DataPathParams = PARAMS) -> Policy:
    """The policy exactly as the inference worker reads it (float32 through shared memory)."""
    policy = build_policy(params).eval()
    PolicyWeights(actors["learner"].context, 0).read_into(policy.published_tensors())
    return policy


ROWS = [(3, 0), (7, 2), (0, 3)]


def check_rows(rollout: FakeRollout, rows: list[tuple[int, int]], policy: Policy,
               version: int, deterministic: bool = False, tolerance: float | None = None) -> None:
    """Outputs sit in exactly ``rows`` and match ``policy`` recomputed on the same inputs (to
    ``tolerance``, or float32's default, absolute and relative)."""
    close = functools.partial(torch.testing.assert_close, atol=tolerance, rtol=tolerance)
    t = {k: torch.from_numpy(v.copy()) for k, v in rollout.buffer.numpy.items()}
    slots, ts = torch.tensor(rows).T
    model = policy.model
    with torch.no_grad():
        features = model.encoder(policy.obs_normalizer({"obs": t["obs.obs"][slots, ts]}))
        core_out, state = model.core.step(features, t["rnn"][slots, ts])
        dist = model.distribution(core_out)
        value = model.critic(core_out).squeeze(-1)
    actions = t["actions"][slots, ts]
    if model.action_heads is not None:
        assert ((actions >= 0) & (actions < model.action_heads[0])).all()
    if deterministic:
        assert torch.equal(actions, dist.mode())
    close(t["log_probs"][slots, ts], dist.log_prob(actions))
    close(t["action_params"][slots, ts], dist.params)  # the behaviour distribution, for KL
    close(t["values"][slots, ts], value)
    close(t["rnn"][slots, ts + 1], state)
    assert (t["versions"][slots, ts] == version).all()
    # Every other row keeps its sentinel.
    written = torch.zeros(t["versions"].shape, dtype=torch.bool)
    written[slots, ts] = True
    untouched = t["actions"][~written]
    assert (untouched.isnan() if untouched.is_floating_point() else untouched == -1).all()
    assert (t["versions"][~written] == -1).all()
    assert t["log_probs"][~written].isnan().all() and t["values"][~written].isnan().all()
    assert t["action_params"][~written].isnan().all()
    state_written = torch.zeros_like(written)
    state_written[slots, ts] = state_written[slots, ts + 1] = True
    assert t["rnn"][~state_written].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("deterministic", "transport"),
                         [(False, "inproc"), (True, "inproc"), (False, "ipc")])
async def test_outputs_land_in_the_requested_rows(deterministic: bool, transport: str,
                                                  device: str) -> None:
    async with run(transport=transport, deterministic=deterministic, device=device) as actors:
        assert actors["inference"].served[0].model.device.type == device
        rollout, learner = actors["rollout.1"], actors["learner"]
        learner.publish(trained_policy(1), 1, announce=False)
        rollout.request(1, ROWS, seed=5)
        await rollout.wait(1)
        assert rollout.answers == [ActionsReady(1, 1)]
        assert actors["rollout.0"].answers == []  # routed by key to the worker that asked
        # On a GPU the float32 kernels differ from the CPU's recomputation (3e-4 seen on an
        # H100 for log-probabilities of a few units).
        check_rows(rollout, ROWS, as_served(actors), 1, deterministic,
                   tolerance=None if device == "cpu" else 1e-3)


@pytest.mark.parametrize("device", DEVICES)
async def test_new_weights_are_used_from_the_next_batch(device: str) -> None:
    async with run(deterministic=True, device=device) as actors:
        rollout, learner, inference = actors["rollout.0"], actors["learner"], actors["inference"]
        learner.publish(trained_policy(1), 1, announce=False)
        rollout.request(0, ROWS, seed=5)
        await rollout.wait(1)
        first = rollout.buffer.numpy["actions"].copy()
        # Published without a signal: picked up by the version check before the next batch.
        learner.publish(trained_policy(2), 2, announce=False)
        rollout.request(0, ROWS, seed=5)  # the very same inputs
        await rollout.wait(2)
        check_rows(rollout, ROWS, as_served(actors), 2, deterministic=True,
                   tolerance=None if device == "cpu" else 1e-3)
        assert not np.array_equal(first, rollout.buffer.numpy["actions"])
        # Announced: refreshed on the signal, before any request.
        learner.publish(trained_policy(3), 3, announce=True)
        await asyncio.sleep(0)
        assert inference.version == 3


DOOM = dataclasses.replace(PARAMS, env="doom_basic", model=ModelConfig(hidden=32, core_size=16))


@pytest.mark.parametrize(("device", "cuda_graphs"), [
    pytest.param("cpu", False, id="cpu"),
    pytest.param("cuda", False, id="cuda", marks=CUDA_ONLY),
    pytest.param("cuda", True, id="cuda-graphs", marks=CUDA_ONLY)])
async def test_conv_policy_serves_new_weights_on_every_device(device: str,
                                                             cuda_graphs: bool) -> None:
    # The default model (conv encoder in its compute precision, GRU). On a CPU it runs on
    # packed weights, packed again at each refresh; on a GPU each refresh is one upload of the
    # whole vector, then casts into the parameters, which a replayed CUDA graph reads in place
    # (as the normalizer's factors, refreshed with them).
    packs = device == "cpu"
    async with run(DOOM, deterministic=True, device=device, cuda_graphs=cuda_graphs) as actors:
        rollout, learner, inference = actors["rollout.0"], actors["learner"], actors["inference"]
        assert (inference.served[0].model.packed is not None) == packs
        assert (inference.served[0].model.graphed is not None) == cuda_graphs
        for version in (1, 2):
            learner.publish(trained_policy(version, DOOM), version, announce=False)
            rollout.request(0, ROWS, seed=5)
            await rollout.wait(version)
            # bfloat16 rounding apart, the outputs of the weights just published
            check_rows(rollout, ROWS, as_served(actors, DOOM), version, deterministic=True,
                       tolerance=0.05)


async def test_forced_bfloat16_serves_on_any_cpu() -> None:
    # precision: bfloat16 forces bf16 arithmetic; where oneDNN has no bf16 kernels (AVX2 only)
    # the eager model runs it instead of the packed step, which would fail at its first call.
    forced = dataclasses.replace(DOOM, model=dataclasses.replace(DOOM.model, precision="bfloat16"))
    async with run(forced, deterministic=True, device="cpu") as actors:
        rollout, learner, inference = actors["rollout.0"], actors["learner"], actors["inference"]
        assert (inference.served[0].model.packed is not None) == onednn_has_bf16()
        learner.publish(trained_policy(1, forced), 1, announce=False)
        rollout.request(0, ROWS, seed=5)
        await rollout.wait(1)
        check_rows(rollout, ROWS, as_served(actors, forced), 1, deterministic=True,
                   tolerance=0.05)


async def test_requests_of_one_loop_iteration_share_a_forward_pass() -> None:
    async with run() as actors:
        first, second, inference = actors["rollout.0"], actors["rollout.1"], actors["inference"]
        actors["learner"].publish(trained_policy(1), 1, announce=False)
        before = inference.batches
        first.request(0, [(1, 0), (2, 1)], seed=1)
        first.request(1, [(5, 0)], seed=2)
        second.request(0, ROWS, seed=3)
        await first.wait(2)
        await second.wait(1)
        assert inference.batches == before + 1
        assert first.answers == [ActionsReady(0, 0), ActionsReady(0, 1)]
        assert second.answers == [ActionsReady(1, 0)]
        policy = as_served(actors)
        check_rows(first, [(1, 0), (2, 1), (5, 0)], policy, 1)
        check_rows(second, ROWS, policy, 1)


async def test_random_actions_need_no_model_or_learner() -> None:
    async with run(learner=False, random_actions=True) as actors:
        rollout = actors["rollout.0"]
        rollout.request(1, ROWS, seed=4)
        await rollout.wait(1)
        assert actors["inference"].policy is None
        b = rollout.buffer.numpy
        slots, ts = np.array(ROWS).T
        assert np.isin(b["actions"][slots, ts], (0, 1)).all()
        assert np.allclose(b["log_probs"][slots, ts], np.log(0.5))
        assert (b["values"][slots, ts] == 0).all() and (b["versions"][slots, ts] == 0).all()
        assert (b["rnn"][slots, ts + 1] == 0).all()
        assert (b["actions"] != -1).sum() == len(ROWS)


PENDULUM = dataclasses.replace(PARAMS, env="gym:Pendulum-v1")


async def test_continuous_actions() -> None:
    async with run(PENDULUM) as actors:
        rollout = actors["rollout.0"]
        actors["learner"].publish(trained_policy(1, PENDULUM), 1, announce=False)
        rollout.request(0, ROWS, seed=6)
        await rollout.wait(1)
        check_rows(rollout, ROWS, as_served(actors, PENDULUM), 1)


async def test_random_continuous_actions() -> None:
    async with run(PENDULUM, learner=False, random_actions=True) as actors:
        rollout = actors["rollout.0"]
        rollout.request(0, ROWS, seed=6)
        await rollout.wait(1)
        b = rollout.buffer.numpy
        slots, ts = np.array(ROWS).T
        actions = b["actions"][slots, ts, 0]
        assert np.isfinite(actions).all() and np.isnan(b["actions"]).sum() == b["actions"].size - 3
        expected = -0.5 * actions**2 - 0.5 * np.log(2 * np.pi)  # standard normal density
        np.testing.assert_allclose(b["log_probs"][slots, ts], expected, rtol=1e-5)


async def test_replicas_beside_their_rollout_workers_sample_their_own_actions() -> None:
    # appo_local_inference.yaml's layout: an inference worker in each rollout process. With the
    # same weights (a uniform policy) and the same observations, the two must not act alike:
    # each samples from its own stream.
    iparams = InferenceWorker.Params(device="cpu")
    processes = (
        ProcessSpec("rollout", (ActorSpec("rollout", f"{HERE}:FakeRollout", PARAMS),
                                ActorSpec("inference",
                                          "sfbus_components.sampling.inference_worker:InferenceWorker",
                                          iparams)), 2),
        ProcessSpec("learner", (ActorSpec("learner", f"{HERE}:FakeLearner", PARAMS),)),
    )
    connections = (
        ConnectionSpec("rollout", "inference_requested", "inference", "on_inference_requested",
                       "local"),
        ConnectionSpec("inference", "actions_ready", "rollout", "on_actions_ready", "local"),
        ConnectionSpec("learner", "weights_updated", "inference", "on_weights_updated"),
    )
    async with hosted(Topology("test", "<test>", processes, connections)) as actors:
        uniform = build_policy(PARAMS)
        for param in uniform.model.actor.parameters():
            param.data.zero_()
        actors["learner"].publish(uniform, 1, announce=False)
        rows = [(s, t) for s in range(4) for t in range(4)]
        for i in range(4):
            for r in (0, 1):
                actors[f"rollout.{r}"].request(0, rows[4 * i:4 * i + 4], seed=i)
                await actors[f"rollout.{r}"].wait(i + 1)
        slots, ts = np.array(rows).T
        first, second = (actors[f"rollout.{r}"].buffer.numpy["actions"][slots, ts]
                         for r in (0, 1))
        assert np.isin(first, (0, 1)).all() and np.isin(second, (0, 1)).all()
        assert not np.array_equal(first, second)  # equal by chance: 2**-16
        seeds = {actors[f"inference.{r}"].sampling.initial_seed() for r in (0, 1)}
        assert len(seeds) == 2
