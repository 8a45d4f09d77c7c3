"""A learner under PBT: hyperparameter changes and an atomic weight exchange between learners."""

from __future__ import annotations

import torch

from sfbus import Actor, Signal, slot
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology
from sfbus_components.datapath.messages import (
    BatchReady,
    HyperparamsChanged,
    LearnerIdle,
    PolicyReplaced,
    ReplacePolicy,
    WeightsUpdated,
)
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.learning.checkpoint import latest_checkpoint, load_checkpoint
from sfbus_components.learning.learner import Learner
from sfbus_components.learning.population_member import is_population_member, snapshot_dir
from tests.components.learning.test_learner import (
    APPO,
    BATCH,
    SETTINGS,
    bandit_batch,
    bandit_learner,
    until,
)
from tests.kernel.conftest import hosted

HERE = "tests.components.learning.test_population_member"


class PbtDriver(Actor):
    """Stands in for the batcher of policy 0, the inference worker and the PBT actor."""

    batch_ready = Signal(BatchReady)
    replace_policy = Signal(ReplacePolicy)
    hyperparams_changed = Signal(HyperparamsChanged)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.idle: list[int] = []
        self.updates: list[WeightsUpdated] = []
        self.replaced: list[PolicyReplaced] = []

    @slot
    def on_learner_idle(self, msg: LearnerIdle) -> None:
        """Record which learner is idle."""
        self.idle.append(msg.policy)

    @slot
    def on_weights_updated(self, msg: WeightsUpdated) -> None:
        """Record published versions."""
        self.updates.append(msg)

    @slot
    def on_policy_replaced(self, msg: PolicyReplaced) -> None:
        """Record finished exchanges."""
        self.replaced.append(msg)


def two_learners() -> Topology:
    """Policies 0 and 1 learning in one process from the learner test's fake workers."""
    data = DataPathParams(**SETTINGS, num_policies=2)
    learners = tuple(ActorSpec(f"learner_{p}", "sfbus_components.learning.learner:Learner",
                               Learner.Params(appo=APPO, policy=p, device="cpu"))
                     for p in (0, 1))
    wires = [("driver", "batch_ready", "learner_0", "on_batch_ready")]
    for p in (0, 1):
        wires += [(f"learner_{p}", "learner_idle", "driver", "on_learner_idle"),
                  (f"learner_{p}", "weights_updated", "driver", "on_weights_updated"),
                  (f"learner_{p}", "policy_replaced", "driver", "on_policy_replaced"),
                  (f"learner_{p}", "slots_released", "rollout", "on_slots_released", "any"),
                  ("driver", "replace_policy", f"learner_{p}", "on_replace_policy"),
                  ("driver", "hyperparams_changed", f"learner_{p}", "on_hyperparams_changed")]
    return Topology("pbt-learners", "<test>", (
        ProcessSpec("rollout", (ActorSpec("rollout",
                                          "tests.components.learning.test_learner:FakeRollout",
                                          data),), replicas=2),
        ProcessSpec("learn", learners),
        ProcessSpec("drive", (ActorSpec("driver", f"{HERE}:PbtDriver", None),)),
    ), tuple(ConnectionSpec(*w) for w in wires))  # type: ignore[arg-type]


def same_state(a: dict, b: dict) -> bool:
    """Nested dicts/lists of tensors and numbers are equal."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


async def test_exchange_copies_the_whole_training_state(tmp_path) -> None:
    async with hosted(two_learners(), run_dir=str(tmp_path)) as actors:
        source, target, driver = actors["learner_0"], actors["learner_1"], actors["driver"]
        await until(lambda: sorted(driver.idle) == [0, 1])
        driver.batch_ready.emit(BATCH)  # the source trains once: now it differs from the target
        await until(lambda: driver.idle.count(0) == 2 and source.weights.version == 2)
        assert source.training.version == 2 and target.training.version == 1
        assert not torch.equal(source.weights.weights, target.weights.weights)

        driver.replace_policy.emit(ReplacePolicy(policy=1, source=0, exchange=7))
        await until(lambda: driver.replaced)
        done, = driver.replaced
        assert (done.policy, done.source, done.exchange, done.ok) == (1, 0, 7, True)
        assert done.source_version == 2 and done.version == 2  # the target's own counter + 1
        assert target.training.version == target.population.min_version == 2
        assert source.training.version == 2
        assert torch.equal(target.weights.weights, source.weights.weights)  # what inference reads
        assert WeightsUpdated(1, 2) in driver.updates
        assert same_state(target.training.learned_state(), source.training.learned_state())
        # the target checkpointed the copy; the snapshot is kept for inspection
        saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints" / "policy_1"))
        assert saved["version"] == 2 and saved["min_version"] == 2
        snapshot = load_checkpoint(latest_checkpoint(snapshot_dir(tmp_path, 7)))
        assert same_state(saved["policy"], snapshot["policy"])

        driver.hyperparams_changed.emit(HyperparamsChanged(
            1, ("appo.adam_beta1", "appo.entropy_coeff", "appo.lr", "reward_shaping.death"),
            (0.95, 0.01, 5e-4, -1.0)))
        await until(lambda: target.params.appo.lr == 5e-4)
        assert target.params.appo.entropy_coeff == 0.01
        assert target.training.optimizer.param_groups[0]["lr"] == 5e-4
        assert target.training.optimizer.param_groups[0]["betas"] == (0.95, APPO.adam_beta2)
        assert source.params.appo.lr == APPO.lr  # another policy's change
        assert target.state()["hyperparams"] == {"appo.adam_beta1": 0.95,
                                                 "appo.entropy_coeff": 0.01, "appo.lr": 5e-4,
                                                 "reward_shaping.death": -1.0}


def test_steps_of_replaced_weights_are_not_trained_on() -> None:
    learner = bandit_learner()
    batch = bandit_batch(learner, torch.Generator().manual_seed(0))
    batch["policies"][0] = 1  # another policy's trajectory: masked, as before
    assert learner.population.valid_steps(batch).sum() == 7 * batch["versions"].shape[1]
    learner.population.min_version = learner.training.version + 1  # an exchange published it
    assert learner.population.discards(batch)
    batch["versions"][2:4] = learner.population.min_version
    assert learner.population.valid_steps(batch).sum() == 2 * batch["versions"].shape[1]
    assert not learner.population.discards(batch)


def test_hyperparameters_survive_a_checkpoint() -> None:
    learner = bandit_learner()
    learner.params = learner.population.apply_hyperparams(
        learner.params, {"appo.lr": 2e-3, "reward_scale": 0.5})
    learner.population.min_version = 4
    state = learner.state()
    resumed = bandit_learner()
    resumed.restore(state)
    assert resumed.params.appo.lr == 2e-3 and resumed.params.reward_scale == 0.5
    assert resumed.training.optimizer.param_groups[0]["lr"] == 2e-3
    assert resumed.population.min_version == 4


def test_pbt_finds_its_members_by_their_exchange_slot() -> None:
    assert is_population_member(Learner)
    assert not is_population_member(PbtDriver)  # sends exchanges, takes none
    assert not is_population_member(int)
