"""Checkpoints: atomic writes, keeping the newest K, clear errors, bit-identical resume."""

from __future__ import annotations

import math

import pytest
import torch

from sfbus_components.algo import AppoConfig
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.learning import checkpoint
from sfbus_components.learning.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_newest,
    save_checkpoint,
)
from sfbus_components.learning.checkpoint_schedule import LearnerCheckpoints
from sfbus_components.learning.learner import Learner
from sfbus_components.models import ModelConfig

T = 8


def state(step: int) -> dict:
    """A small state with every required key."""
    return {"policy": {"w": torch.full((3,), float(step))}, "optimizer": {}, "version": step,
            "env_frames": 4 * step, "train_steps": step, "samples": step,
            "config": {"env": "gym:CartPole-v1", "model": {"core": "gru", "core_size": 16}}}


def test_keeps_the_newest_k_in_a_private_folder(tmp_path):
    folder = tmp_path / "checkpoints" / "policy_0"
    for step in range(1, 6):
        path = save_checkpoint(folder, state(step), step, keep=3)
        assert path == folder / f"checkpoint_{step:09d}.pt"
    assert [p.name for p in list_checkpoints(folder)] == [
        "checkpoint_000000003.pt", "checkpoint_000000004.pt", "checkpoint_000000005.pt"]
    assert latest_checkpoint(folder) == folder / "checkpoint_000000005.pt"
    loaded = load_checkpoint(latest_checkpoint(folder))
    assert loaded["version"] == 5 and torch.equal(loaded["policy"]["w"], torch.full((3,), 5.0))
    assert folder.stat().st_mode & 0o777 == 0o700
    assert latest_checkpoint(tmp_path / "missing") is None


def test_a_crash_mid_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, state(1), 1, keep=3)
    real_save = torch.save

    def crash(obj, file, *args, **kwargs):
        file.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", crash)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path, state(2), 2, keep=3)
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000000001.pt"]
    assert load_checkpoint(latest_checkpoint(tmp_path))["version"] == 1

    # a process killed mid-write leaves its temporary file: the next save removes it
    (tmp_path / ".checkpoint_killed.tmp").write_bytes(b"PK\x03\x04")
    save_checkpoint(tmp_path, state(2), 2, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint_000000001.pt", "checkpoint_000000002.pt"]


def test_a_corrupt_file_names_itself(tmp_path):
    good = save_checkpoint(tmp_path, state(7), 7, keep=3)
    good.write_bytes(good.read_bytes()[:100])  # truncated
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(good)
    assert str(error.value) == (
        f"{good}: cannot read checkpoint (corrupt or truncated file); delete it to resume from "
        f"the previous checkpoint")

    other = tmp_path / "checkpoint_000000008.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(other)
    assert str(error.value) == (f"{other}: not a learner checkpoint (missing policy, optimizer, "
                                f"version, env_frames, train_steps, samples, config)")


def test_resume_falls_back_past_truncated_checkpoints_and_says_so(tmp_path, caplog):
    import logging

    for step in (1, 2, 3):
        save_checkpoint(tmp_path, state(step), step, keep=3)
    for step in (2, 3):  # a crash or a full disk left the newest two truncated
        newest = tmp_path / f"checkpoint_{step:09d}.pt"
        newest.write_bytes(newest.read_bytes()[:100])
    with caplog.at_level(logging.WARNING):
        path, loaded = load_newest(tmp_path, state(1)["config"], log=logging.getLogger("t"))
    assert path.name == "checkpoint_000000001.pt" and loaded["version"] == 1
    assert caplog.messages == [
        "skipped unreadable learner checkpoint(s) checkpoint_000000003.pt, "
        f"checkpoint_000000002.pt (truncated or corrupt); resuming from {path}"]
    (tmp_path / "checkpoint_000000001.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no readable learner checkpoint \(all of "
                       r"checkpoint_000000003.pt, checkpoint_000000002.pt, "
                       r"checkpoint_000000001.pt are truncated or corrupt\)"):
        load_newest(tmp_path)
    assert load_newest(tmp_path / "none") is None
    # a mismatch is never skipped: resuming with other settings is the user's mistake
    save_checkpoint(tmp_path, state(4), 4, keep=9)
    with pytest.raises(CheckpointError, match="saved with a different configuration"):
        load_newest(tmp_path, {"env": "doom_basic", "model": {}})


def test_a_mismatched_configuration_is_refused(tmp_path):
    path = save_checkpoint(tmp_path, state(1), 1, keep=3)
    expected = {"env": "doom_basic", "model": {"core": "gru", "core_size": 512}}
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path, expected)
    assert str(error.value) == (
        f"{path}: saved with a different configuration (env: checkpoint 'gym:CartPole-v1', this "
        f"run 'doom_basic'; model.core_size: checkpoint 16, this run 512); resume with the "
        f"settings it was saved with, or start a new run directory")
    assert load_checkpoint(path, state(1)["config"])["version"] == 1


# ----- a learner restored from a checkpoint is the learner that saved it ----------------------

def make_learner() -> Learner:
    """A small GRU learner on CartPole's shapes with normalizers and shuffled minibatches."""
    data = DataPathParams(env="gym:CartPole-v1", rollout=T, num_envs=4, batch_size=64,
                          model=ModelConfig(core="gru", core_size=16, mlp_layers=(16,)), seed=3)
    params = Learner.Params(appo=AppoConfig(lr=1e-3, num_batches_per_epoch=2, num_epochs=2),
                            reward_scale=0.1, device="cpu")
    learner = Learner("learner", params)
    learner.build(data=data)
    return learner


def random_batch(learner: Learner, seed: int, n: int = 8) -> dict:
    """A random batch in ``BatchCopy``'s layout, acted by the learner's version."""
    gen = torch.Generator().manual_seed(seed)
    return {"obs": {"obs": torch.randn(n, T + 1, 4, generator=gen) * 3 + 1},
            "rnn": torch.randn(n, 16, generator=gen) * 0.1,
            "actions": torch.randint(0, 2, (n, T, 1), generator=gen),
            "log_probs": torch.full((n, T), math.log(0.5)),
            "action_params": torch.zeros(n, T, 2),  # uniform logits, as the log-probs say
            "values": torch.randn(n, T, generator=gen),
            "rewards": torch.rand(n, T, generator=gen),
            "dones": (torch.rand(n, T, generator=gen) < 0.1).to(torch.uint8),
            "time_outs": torch.zeros(n, T, dtype=torch.uint8),
            "versions": torch.full((n, T), learner.training.version, dtype=torch.int64),
            "policies": torch.zeros(n, T, dtype=torch.int64)}


def outputs(learner: Learner) -> list[torch.Tensor]:
    """The policy's outputs on fixed inputs: one step and one sequence."""
    gen = torch.Generator().manual_seed(99)
    obs = {"obs": torch.randn(5, T, 4, generator=gen)}
    state0 = torch.randn(5, 16, generator=gen)
    with torch.no_grad():
        normalized = learner.training.policy.obs_normalizer({"obs": obs["obs"][:, 0]})
        model = learner.training.policy.model
        step = model.forward_step(normalized, state0, deterministic=True)
        dist, values = model.forward_sequence(obs, state0, torch.zeros(5, T))
    return [step.action_logits, step.value, step.rnn_state, normalized["obs"], dist.params,
            values]


def flat_state(learner: Learner) -> list[torch.Tensor]:
    """Every tensor of the optimizer's and returns normalizer's state, in a fixed order."""
    opt = learner.training.optimizer.state_dict()["state"]
    tensors = [v for i in sorted(opt) for _, v in sorted(opt[i].items())]
    return tensors + list(learner.training.returns_normalizer.state_dict().values())


def test_resume_is_bit_identical(tmp_path):
    first = make_learner()
    for seed in range(3):
        first.train(random_batch(first, seed))
    first.checkpoints = LearnerCheckpoints(tmp_path, 0, first.params)
    path = first.save()
    assert path == tmp_path / "checkpoint_000000004.pt"

    second = make_learner()
    second.restore(load_checkpoint(path, second.config_fingerprint()))
    t = second.training
    assert (t.version, t.train_steps, t.samples, t.env_frames) == (4, 3, 192, 192)
    first.training.policy.train(False), second.training.policy.train(False)
    assert all(torch.equal(a, b) for a, b in zip(outputs(first), outputs(second), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(flat_state(first), flat_state(second),
                                                 strict=True))
    first.training.policy.train(), second.training.policy.train()

    # and both go on identically (same shuffles, same Adam moments, same statistics)
    first.train(random_batch(first, 10))
    second.train(random_batch(second, 10))
    assert all(torch.equal(a, b) for a, b in zip(first.training.policy.state_dict().values(),
                                                 second.training.policy.state_dict().values(),
                                                 strict=True))
