"""The training state on its own: saved and restored whole, on the CPU or across devices."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sfbus_components.algo import AppoConfig
from sfbus_components.datapath.settings import DataPathParams, build_policy
from sfbus_components.learning.checkpoint import load_checkpoint, save_checkpoint
from sfbus_components.learning.training_state import TrainingState
from sfbus_components.models import ModelConfig

PARAMS = DataPathParams(env="gym:CartPole-v1", rollout=8, num_envs=4, batch_size=64,
                        model=ModelConfig(core="gru", core_size=16, mlp_layers=(16,)))
APPO = AppoConfig(lr=1e-3, adam_beta1=0.8)


def trained(device: str = "cpu", steps: int = 3) -> TrainingState:
    """A training state that took ``steps`` Adam steps and saw observations and returns."""
    torch.manual_seed(0)
    state = TrainingState(build_policy(PARAMS), APPO, seed=5, device=device)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        state.policy.obs_normalizer.stats["obs"].update(
            state.to_device({"obs": torch.randn(32, 4, generator=gen) * 3 + 1})["obs"])
        state.returns_normalizer.update(torch.randn(32, generator=gen).to(device))
        loss = sum((p.float() - 0.5).square().sum() for p in state.policy.parameters())
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.version += 1
        state.train_steps += 1
        state.samples += 32
        state.env_frames += 128
    return state


def tensors(learned: dict) -> dict[str, torch.Tensor]:
    """Every tensor of a learned state, on the CPU, by a flat name."""
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            flat[prefix] = value.detach().cpu()
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)

    walk("", learned)
    return flat


def assert_same(a: TrainingState, b: TrainingState) -> None:
    """Equal tensors, Adam settings, counters and shuffles."""
    ta, tb = tensors(a.learned_state()), tensors(b.learned_state())
    assert ta.keys() == tb.keys()
    assert [k for k in ta if not torch.equal(ta[k], tb[k])] == []
    groups = [{k: v for k, v in g.items() if k != "params"} for g in (
        a.optimizer.state_dict()["param_groups"][0], b.optimizer.state_dict()["param_groups"][0])]
    assert groups[0] == groups[1]
    assert (a.version, a.train_steps, a.samples, a.env_frames) == (
        b.version, b.train_steps, b.samples, b.env_frames)
    assert torch.equal(a.minibatches(16, 4)[0].cpu(), b.minibatches(16, 4)[0].cpu())


def save_and_load(state: TrainingState, folder: Path, device: str = "cpu") -> TrainingState:
    """Through a checkpoint file into a fresh state on ``device``."""
    path = save_checkpoint(folder, {**state.state_dict(), "config": {}}, state.version, keep=1)
    restored = TrainingState(build_policy(PARAMS), AppoConfig(), seed=0, device=device)
    restored.load_state_dict(load_checkpoint(path, map_location=device))
    return restored


def test_the_training_state_is_saved_and_restored_alone(tmp_path: Path) -> None:
    state = trained()
    assert state.optimizer.state_dict()["state"]  # Adam has moments to carry
    stats = state.policy.obs_normalizer.stats["obs"]
    assert stats.count == 96 and not torch.equal(stats.mean, torch.zeros(4))
    restored = save_and_load(state, tmp_path)
    assert (restored.version, restored.train_steps) == (4, 3)
    assert_same(state, restored)
    # and both go on identically
    for s in (state, restored):
        loss = sum(p.square().sum() for p in s.policy.parameters())
        s.optimizer.zero_grad()
        loss.backward()
        s.optimizer.step()
    assert_same(state, restored)


def test_a_checkpoint_holds_only_cpu_tensors_and_python_numbers() -> None:
    saved = trained(steps=1).state_dict()
    found = tensors_in(saved)
    assert found and all(t.device.type == "cpu" for t in found)
    assert isinstance(saved["version"], int) and saved["version"] == 2


def tensors_in(value: object) -> list[torch.Tensor]:
    """Every tensor in nested dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value \
        if isinstance(value, (list, tuple)) else ()
    return [t for item in items for t in tensors_in(item)]


def test_a_batch_stays_where_it_is_on_the_cpu() -> None:
    state = TrainingState(build_policy(PARAMS), APPO)
    batch = {"rewards": torch.zeros(4, 8), "obs": {"obs": torch.zeros(4, 9, 3)}}
    moved = state.to_device(batch)
    assert moved["rewards"] is batch["rewards"]  # no copy: CPU speed kept
    assert moved["obs"]["obs"] is batch["obs"]["obs"]  # a Trajectories' obs stays nested


def test_a_snapshot_stays_intact_when_put_back_and_trained_on() -> None:
    state = trained(steps=1)
    snapshot = state.snapshot()
    kept = {k: v.clone() for k, v in tensors(snapshot).items()}
    state.load_learned_state(snapshot)
    loss = sum(p.square().sum() for p in state.policy.parameters())
    loss.backward()
    state.optimizer.step()
    state.returns_normalizer.update(torch.ones(8))
    assert not torch.equal(tensors(state.learned_state())[".optimizer.state.0.exp_avg"],
                           kept[".optimizer.state.0.exp_avg"])
    assert all(torch.equal(v, kept[k]) for k, v in tensors(snapshot).items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("trained_on", "resumed_on"), [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_on_another_device(tmp_path: Path, trained_on: str,
                                                resumed_on: str) -> None:
    state = trained(trained_on)
    restored = save_and_load(state, tmp_path, resumed_on)
    assert restored.device.type == resumed_on
    assert all(t.device.type == resumed_on for t in tensors_in(restored.learned_state()))
    ta, tb = tensors(state.learned_state()), tensors(restored.learned_state())
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert (restored.version, restored.env_frames) == (state.version, state.env_frames)
