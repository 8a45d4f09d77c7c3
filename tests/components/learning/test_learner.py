"""The learner: batch copy, slot release order, weight publishing, stats, resume, and learning."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
import torch

from sfbus import Actor, Signal, TopologyError, slot
from sfbus.routing import RoutingTable
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology
from sfbus_components.algo import AppoConfig
from sfbus_components.datapath.buffers import STEP_FIELDS, PolicyWeights, TrajectoryBuffer
from sfbus_components.datapath.messages import (
    BatchReady,
    LearnerIdle,
    SlotsReleased,
    TrainingStats,
    WeightsUpdated,
)
from sfbus_components.datapath.record import DataPath, TrajectoryWriter
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.learning.checkpoint import CheckpointError
from sfbus_components.learning.learner import Learner
from sfbus_components.models import ModelConfig
from tests.devices import DEVICES
from tests.kernel.conftest import hosted

T = 8
SETTINGS = {"env": "gym:CartPole-v1", "rollout": T, "num_envs": 4, "num_splits": 2,
            "batch_size": 64, "model": ModelConfig(core="gru", core_size=16, mlp_layers=(16,))}
APPO = AppoConfig(lr=1e-3)


class FakeRollout(TrajectoryWriter):
    """A rollout worker that only owns a trajectory buffer filled with random steps."""

    Params = DataPathParams
    records = (DataPath,)

    @classmethod
    def shared_arrays(cls, name, params, topology, records):
        """The worker's trajectory buffer, as the real rollout worker declares it."""
        return records[DataPath].layout.array_specs(name)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.released: list[tuple[SlotsReleased, int]] = []
        self.on_release: Callable[[], None] = lambda: None

    async def on_start(self) -> None:
        """Fill every slot with random but well-formed steps acted by version 1."""
        layout = self.context.records[DataPath].layout
        self.buffer = TrajectoryBuffer(self.context, self.name, layout)
        fill_random(self.buffer.numpy, np.random.default_rng(self.context.replica))
        self.weights = PolicyWeights(self.context, 0)

    @slot
    def on_slots_released(self, msg: SlotsReleased) -> None:
        """Record the release with the weights version published at that moment."""
        self.released.append((msg, self.weights.version))
        self.on_release()


def fill_random(fields: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Random observations, actions, behavior log-probs/values, rewards, dones; version 1."""
    for name, array in fields.items():
        if name.startswith("obs."):
            array[:] = rng.normal(size=array.shape)
    fields["actions"][:] = rng.integers(0, 2, size=fields["actions"].shape)
    fields["log_probs"][:] = np.log(0.5) + rng.normal(0, 0.05, size=fields["log_probs"].shape)
    fields["values"][:] = rng.normal(size=fields["values"].shape)
    fields["rewards"][:] = rng.random(size=fields["rewards"].shape)
    fields["dones"][:] = rng.random(size=fields["dones"].shape) < 0.1
    fields["rnn"][:] = rng.normal(0, 0.1, size=fields["rnn"].shape)
    fields["versions"][:] = 1
    fields["policies"][:] = 0


class Driver(Actor):
    """Stands in for the batcher, the inference workers and the stats actor."""

    batch_ready = Signal(BatchReady)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.idle = 0
        self.versions: list[int] = []
        self.stats: list[TrainingStats] = []

    @slot
    def on_learner_idle(self, msg: LearnerIdle) -> None:
        """Count idles."""
        self.idle += 1

    @slot
    def on_weights_updated(self, msg: WeightsUpdated) -> None:
        """Record published versions."""
        self.versions.append(msg.version)

    @slot
    def on_training_stats(self, msg: TrainingStats) -> None:
        """Record stats."""
        self.stats.append(msg)


def learner_topology(mode: str = "async", learner: dict | None = None,
                     **settings: object) -> Topology:
    """Two fake rollout workers, a learner (``learner``: its own parameters), and a driver wired
    like the real data path."""
    settings = {**SETTINGS, **settings, "mode": mode}
    data = DataPathParams(**settings)
    params = Learner.Params(**{"appo": APPO, "device": "cpu", **(learner or {})})
    path = "tests.components.learning.test_learner"
    return Topology("learner", "<test>", (
        ProcessSpec("rollout", (ActorSpec("rollout", f"{path}:FakeRollout", data),), replicas=2),
        ProcessSpec("learn", (ActorSpec("learner",
                "sfbus_components.learning.learner:Learner", params),)),
        ProcessSpec("drive", (ActorSpec("driver", f"{path}:Driver", None),)),
    ), (
        ConnectionSpec("driver", "batch_ready", "learner", "on_batch_ready"),
        ConnectionSpec("learner", "learner_idle", "driver", "on_learner_idle"),
        ConnectionSpec("learner", "weights_updated", "driver", "on_weights_updated"),
        ConnectionSpec("learner", "training_stats", "driver", "on_training_stats"),
        ConnectionSpec("learner", "slots_released", "rollout", "on_slots_released", "any"),
    ))


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.002)


BATCH = BatchReady(policy=0, workers=(0, 1, 0, 1, 1, 0, 0, 1), slots=(0, 1, 3, 2, 4, 5, 7, 6))


def published(learner: Learner) -> torch.Tensor:
    """A copy of the learner's published weights vector."""
    return learner.weights.weights.clone()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transport", ["inproc", "ipc"])
async def test_async_releases_before_training_and_publishes(transport, device):
    async with hosted(learner_topology("async", {"device": device}), transport) as actors:
        learner, driver = actors["learner"], actors["driver"]
        assert learner.training.device.type == device
        workers = [actors["rollout.0"], actors["rollout.1"]]
        await until(lambda: driver.idle == 1 and driver.versions == [1])
        assert learner.weights.version == 1
        before = published(learner)

        # training may only start once both workers got their slots back
        released = threading.Event()
        for worker in workers:
            worker.on_release = lambda: len(workers[0].released) + len(
                workers[1].released) == 2 and released.set()
        train = learner.train
        learner.train = lambda batch: released.wait(10) and train(batch)

        driver.batch_ready.emit(BATCH)
        await until(lambda: driver.idle == 2 and driver.stats)
        assert driver.versions == [1, 2]
        assert learner.weights.version == 2
        assert not torch.equal(before, published(learner))
        for index, worker in enumerate(workers):
            (msg, version), = worker.released
            assert msg.worker == index and version == 1  # released before v2 was published
            pairs = zip(BATCH.workers, BATCH.slots, strict=True)
            assert msg.slots == tuple(s for w, s in pairs if w == index)
        stats, = driver.stats
        assert stats.version == 2 and stats.samples == 64 and stats.env_frames == 64
        figures = [stats.policy_loss, stats.value_loss, stats.entropy, stats.kl,
                   stats.grad_norm, stats.lr, stats.clip_fraction, stats.train_seconds]
        assert all(math.isfinite(x) for x in figures)
        assert stats.lr == APPO.lr and stats.lag_mean == 0.0 and stats.lag_max == 0.0
        assert stats.entropy > 0.5  # near-uniform over 2 actions at the start

        # the copy gathered the right rows, grouped by worker in first-appearance order
        batch, groups = learner.batches.copy(BATCH)
        assert groups == {0: [0, 3, 5, 7], 1: [1, 2, 4, 6]}
        order = [(w, s) for w, slots in groups.items() for s in slots]
        for i, (w, s) in enumerate(order):
            fields = workers[w].buffer.torch
            assert torch.equal(batch["obs"]["obs"][i], fields["obs.obs"][s])
            assert torch.equal(batch["actions"][i], fields["actions"][s, :T])
            assert torch.equal(batch["rnn"][i], fields["rnn"][s, 0])
        assert batch["obs"]["obs"].shape == (8, T + 1, 4) and batch["rewards"].shape == (8, T)
        # keyed as the buffer's arrays, obs.<key> nested under obs: the names the loss reads
        assert set(batch) == {"obs", *STEP_FIELDS} and set(batch["obs"]) == {"obs"}


async def test_async_copies_the_next_batch_while_one_trains():
    async with hosted(learner_topology("async")) as actors:
        learner, driver = actors["learner"], actors["driver"]
        workers = [actors["rollout.0"], actors["rollout.1"]]
        await until(lambda: driver.idle == 1 and driver.versions == [1])
        go = threading.Event()
        train, trained = learner.train, []
        learner.train = lambda batch: trained.append(batch) or (go.wait(10) and train(batch))

        driver.batch_ready.emit(BATCH)
        await until(lambda: driver.idle == 2)  # idle with the first batch still training
        driver.batch_ready.emit(BATCH)
        # the second batch is copied and its slots go back before the first is published
        await until(lambda: all(len(w.released) == 2 for w in workers))
        assert driver.versions == [1] and learner.weights.version == 1
        await asyncio.sleep(0.05)
        assert driver.idle == 2  # and it trains only once the first has
        go.set()
        await until(lambda: driver.versions == [1, 2, 3] and driver.idle == 3)
        assert [s.version for s in driver.stats] == [2, 3]
        # the second copy went to the other buffer: the first batch was not written over
        first, second = (b["obs"]["obs"].data_ptr() for b in trained)
        assert first != second


def test_more_minibatches_than_trajectories_is_refused_at_validation():
    # 64 / 8 = 8 trajectories: a 9th minibatch would be empty and every training step would fail
    too_many = learner_topology(learner={"appo": replace(APPO, num_batches_per_epoch=9)})
    with pytest.raises(TopologyError, match=r"actor 'learner': appo.num_batches_per_epoch \(9\) "
                                            r"exceeds .* = 8\); every minibatch needs one"):
        RoutingTable(too_many).array_specs()
    RoutingTable(learner_topology(learner={"appo": replace(APPO, num_batches_per_epoch=8)})
                 ).array_specs()


async def test_sync_releases_after_publishing():
    async with hosted(learner_topology("sync")) as actors:
        driver = actors["driver"]
        await until(lambda: driver.idle == 1)
        # sync mode: each worker has exactly its share of one batch, slots 0..3
        driver.batch_ready.emit(BatchReady(0, BATCH.workers, (0, 1, 3, 2, 0, 2, 1, 3)))
        await until(lambda: driver.idle == 2)
        workers = [actors["rollout.0"], actors["rollout.1"]]
        await until(lambda: all(w.released for w in workers))
        for worker in workers:
            (_msg, version), = worker.released
            assert version == 2  # the slots came back only after v2 was published


async def test_stop_checkpoints_and_run_dir_resumes(tmp_path):
    async with hosted(learner_topology(), run_dir=str(tmp_path)) as actors:
        first, driver = actors["learner"], actors["driver"]
        await until(lambda: driver.idle == 1)
        driver.batch_ready.emit(BATCH)
        await until(lambda: driver.versions[-1:] == [2])  # trained and published
        final = published(first)
    checkpoints = sorted((tmp_path / "checkpoints" / "policy_0").iterdir())
    assert [p.name for p in checkpoints] == ["checkpoint_000000002.pt"]
    assert (tmp_path / "checkpoints" / "policy_0").stat().st_mode & 0o777 == 0o700

    async with hosted(learner_topology(), run_dir=str(tmp_path)) as actors:
        second, driver = actors["learner"], actors["driver"]
        await until(lambda: driver.versions == [2])
        assert second.weights.version == 2 and torch.equal(published(second), final)
        t = second.training
        assert (t.train_steps, t.samples, t.env_frames) == (1, 64, 64)
        driver.batch_ready.emit(BATCH)
        await until(lambda: driver.versions == [2, 3])


async def test_a_failing_checkpoint_is_reported_and_retried_and_the_batcher_never_waits(
        tmp_path):
    # the checkpoint folder replaced by a file: every periodic save raises
    async with hosted(learner_topology(learner={"checkpoint_every_s": 0.0}),
                      run_dir=str(tmp_path)) as actors:
        learner, driver = actors["learner"], actors["driver"]
        await until(lambda: driver.idle == 1)
        failures: list[str] = []
        learner.on_failure = lambda where, error: failures.append(f"{where}: {error!r}")
        (tmp_path / "checkpoints").write_text("not a folder")
        for n in (2, 3):
            driver.batch_ready.emit(BATCH)
            # idle after each batch, save failed or not; its save fails after it published
            await until(lambda n=n: driver.idle == n and len(failures) == n - 1)
        assert driver.versions == [1, 2, 3]  # and it kept training
        assert [f.split(":")[0] for f in failures] == ["checkpoint", "checkpoint"]
        (tmp_path / "checkpoints").unlink()
        driver.batch_ready.emit(BATCH)
        await until(lambda: (tmp_path / "checkpoints" / "policy_0" /
                             "checkpoint_000000004.pt").exists())
        learner.save = lambda: None  # the final checkpoint is not what this test is about


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_batch_whose_training_raises_still_frees_its_slots_and_says_idle(mode):
    async with hosted(learner_topology(mode)) as actors:
        learner, driver = actors["learner"], actors["driver"]
        workers = [actors["rollout.0"], actors["rollout.1"]]
        await until(lambda: driver.idle == 1)
        gave_up: list[str] = []
        learner.fail_process = gave_up.append  # the real one ends the process (exit 1)
        failures: list[str] = []
        learner.on_failure = lambda where, error: failures.append(where)

        def broken(batch):
            raise RuntimeError("boom")

        learner.train = broken
        slots = (0, 1, 3, 2, 0, 2, 1, 3) if mode == "sync" else BATCH.slots
        for n in range(2, 2 + learner.params.max_failed_batches):
            driver.batch_ready.emit(BatchReady(0, BATCH.workers, slots))
            # async mode says idle before the batch trains: its failure is reported after
            await until(lambda n=n: driver.idle == n and len(failures) == n - 1)
            assert all(len(w.released) == n - 1 for w in workers)  # slots back every time
            assert bool(gave_up) == (n - 1 == learner.params.max_failed_batches)
        assert gave_up == ["3 batches in a row failed, the last with RuntimeError('boom')"]


async def test_mismatched_model_refuses_to_resume(tmp_path):
    async with hosted(learner_topology(), run_dir=str(tmp_path)):
        pass
    other = replace(SETTINGS["model"], core_size=8)
    topology = learner_topology(model=other)
    with pytest.raises(CheckpointError, match=r"model\.core_size: checkpoint 16, this run 8"):
        async with hosted(topology, run_dir=str(tmp_path)):
            pass


# ----- the training step on its own (no shared memory) ---------------------------------------

def bandit_learner(device: str = "cpu", **appo: object) -> Learner:
    """A learner on CartPole's shapes with no core, raw inputs, and a fast learning rate."""
    data = DataPathParams(**{**SETTINGS, "model": ModelConfig(
        core="none", mlp_layers=(16,), normalize_input=False)}, seed=1)
    learner = Learner("learner", Learner.Params(appo=replace(APPO, lr=3e-3, **appo)))
    learner.build(torch.device(device), data)
    return learner


def bandit_batch(learner: Learner, gen: torch.Generator, n: int = 8) -> dict:
    """One-step episodes: reward 1 for action 1 when obs[0] > 0, for action 0 otherwise.

    Actions are sampled from the current policy, as inference would (on-policy, lag 0).
    """
    obs = torch.randn(n, T + 1, 4, generator=gen)
    dones = torch.ones(n, T, dtype=torch.uint8)
    device = learner.training.device
    with torch.no_grad():
        dist, values = learner.training.policy.model.forward_sequence(
            {"obs": obs[:, :T].to(device)}, torch.zeros(n, 0, device=device), dones.to(device))
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        actions = dist.sample()
        log_probs = dist.log_prob(actions)
        params = dist.params.cpu()
    actions, log_probs, values = actions.cpu(), log_probs.cpu(), values.cpu()  # as in a batch
    rewards = (actions[..., 0] == (obs[:, :T, 0] > 0).long()).float()
    return {"obs": {"obs": obs}, "rnn": torch.zeros(n, 0), "actions": actions,
            "log_probs": log_probs, "action_params": params, "values": values,
            "rewards": rewards, "dones": dones, "time_outs": torch.zeros(n, T, dtype=torch.uint8),
            "versions": torch.full((n, T), learner.training.version, dtype=torch.int64),
            "policies": torch.zeros(n, T, dtype=torch.int64)}


def rewarded_log_prob(learner: Learner) -> float:
    """Mean log-probability of the rewarded action on fixed observations."""
    device = learner.training.device
    obs = torch.randn(256, 1, 4, generator=torch.Generator().manual_seed(123)).to(device)
    with torch.no_grad():
        dist, _ = learner.training.policy.model.forward_sequence(
            {"obs": obs}, torch.zeros(256, 0, device=device), torch.zeros(256, 1, device=device))
    best = (obs[..., 0] > 0).long().unsqueeze(-1)
    return float(dist.log_prob(best).mean())


@pytest.mark.parametrize("device", DEVICES)
def test_training_raises_log_prob_of_rewarded_actions(device):
    learner = bandit_learner(device, num_batches_per_epoch=2)
    gen = torch.Generator().manual_seed(0)
    start = rewarded_log_prob(learner)
    assert start < math.log(0.7)  # the fresh policy does not already prefer the rewarded action
    for _ in range(300):
        result = learner.train(bandit_batch(learner, gen))
        assert result["skipped"] == 0
    end = rewarded_log_prob(learner)
    assert end > math.log(0.85), (start, end)
    assert learner.training.version == 301 and learner.training.train_steps == 300


def test_non_finite_loss_skips_the_step():
    learner = bandit_learner()
    batch = bandit_batch(learner, torch.Generator().manual_seed(0))
    batch["rewards"][0, 0] = math.nan
    weights = [p.detach().clone() for p in learner.training.policy.parameters()]
    normalizer = learner.training.returns_normalizer.state_dict()
    normalizer = {k: v.clone() for k, v in normalizer.items()}
    result = learner.train(batch)
    assert result["skipped"] == 1 and math.isnan(result["grad_norm"])
    assert all(torch.equal(a, b)
               for a, b in zip(weights, learner.training.policy.parameters(), strict=True))
    assert all(torch.equal(v, learner.training.returns_normalizer.state_dict()[k])
               for k, v in normalizer.items())


def test_reward_scale_scales_the_value_targets():
    """The learner's reward_scale times the env's own (EnvSpec.reward_scale) scales targets."""
    losses = {}
    for scale, env_scale in ((1.0, 1.0), (0.1, 1.0), (1.0, 0.1)):
        learner = bandit_learner(normalize_returns=False)
        learner.params = replace(learner.params, reward_scale=scale)
        learner.update.env_reward_scale = env_scale  # as the spec of e.g. doom_basic sets it
        with torch.no_grad():  # V = 0, so the value loss is the mean squared target
            learner.training.policy.model.critic.weight.zero_()
            learner.training.policy.model.critic.bias.zero_()
        batch = bandit_batch(learner, torch.Generator().manual_seed(0))
        rewards = batch["rewards"].clone()
        losses[scale, env_scale] = learner.train(batch)["value_loss"]
        assert torch.equal(batch["rewards"], rewards)  # the caller's batch is not modified
    assert losses[1.0, 1.0] > 0.1
    assert losses[0.1, 1.0] == pytest.approx(losses[1.0, 1.0] * 0.1**2, rel=1e-3)
    assert losses[1.0, 0.1] == pytest.approx(losses[1.0, 1.0] * 0.1**2, rel=1e-3)
