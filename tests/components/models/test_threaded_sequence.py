"""The learner's BPTT split over threads: the same outputs and gradients as the whole batch,
each share on its own thread both ways, errors carried back, and the learner's setting."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest
import torch

from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.learning.learner import Learner
from sfbus_components.models import ActorCritic, ModelConfig
from tests.components.learning.test_learner import APPO, SETTINGS
from tests.components.models.test_models import HEADS, IMAGE, random_obs

BATCH, STEPS = 5, 4  # five trajectories: shares of 3 + 2 (two threads), 2 + 2 + 1 (three)


def make_model(core: str, shared: bool, threads: int) -> tuple[ActorCritic, dict]:
    """A small conv + core model whose forward_sequence splits over ``threads``."""
    torch.manual_seed(0)
    spec = {"obs": IMAGE, "measurements": ((5,), "float32")}
    cfg = ModelConfig(architecture="full", core=core, hidden=32, core_size=16,
                      measurements_hidden=(8,), precision="float32",
                      actor_critic_share_weights=shared)
    model = ActorCritic(spec, HEADS, None, cfg)
    model.sequence_threads = threads
    return model, spec


def batch(spec: dict) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Observations, entering states and dones with episode ends at different steps."""
    torch.manual_seed(1)
    dones = torch.zeros(BATCH, STEPS)
    dones[0, 1] = dones[3, 2] = dones[4, 0] = 1.0
    return random_obs(spec, BATCH, STEPS), torch.randn(BATCH, 64), dones


def outputs_and_grads(model: ActorCritic, spec: dict) -> tuple[list[torch.Tensor], dict]:
    """Logits and values of a pass, and the parameters' gradients of a loss over both."""
    obs, state, dones = batch(spec)
    dist, values = model.forward_sequence(obs, state[:, : model.state_size], dones)
    actions = torch.stack([torch.randint(0, n, (BATCH, STEPS)) for n in HEADS], dim=-1)
    loss = (dist.log_prob(actions) * torch.linspace(-1, 1, STEPS)).sum() + values.square().sum()
    loss.backward()
    return [dist.params.detach(), values.detach()], {
        name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize(("core", "shared"), [("gru", True), ("lstm", True), ("gru", False)])
def test_threads_compute_what_the_whole_batch_computes(core: str, shared: bool,
                                                       threads: int) -> None:
    whole, spec = make_model(core, shared, threads=1)
    split, _ = make_model(core, shared, threads)
    expected, expected_grads = outputs_and_grads(whole, spec)
    got, grads = outputs_and_grads(split, spec)
    for a, b in zip(got, expected, strict=True):
        assert_close_to_scale(a, b)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        assert grad is not None and grad.abs().sum() > 0, name
        assert_close_to_scale(grads[name], grad, name)


def assert_close_to_scale(got: torch.Tensor, expected: torch.Tensor, name: str = "") -> None:
    """Equal within 1e-5 of the tensor's largest value: sums over other shares of the batch
    round differently, so an element that cancels to near zero has no relative precision."""
    error, scale = (got - expected).abs().max().item(), expected.abs().max().item()
    assert error <= 1e-5 * scale + 1e-8, f"{name}: {error:.3g} off at scale {scale:.3g}"


def test_each_share_runs_on_its_own_thread_both_ways() -> None:
    model, spec = make_model("gru", True, threads=2)
    forward: list[tuple[int, int]] = []
    backward: list[int] = []

    def record(_module: object, args: tuple, out: torch.Tensor) -> None:
        forward.append((threading.get_ident(), len(args[0]["obs"])))
        out.register_hook(lambda _grad: backward.append(threading.get_ident()))
    model.encoder.register_forward_hook(record)
    outputs_and_grads(model, spec)
    assert sorted(rows for _, rows in forward) == [2 * STEPS, 3 * STEPS]
    assert len({ident for ident, _ in forward}) == 2
    assert len(backward) == 2 and len(set(backward)) == 2


def loaded_openmp() -> ctypes.CDLL | None:
    """The GNU OpenMP runtime torch loaded into this process, if any."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libgomp" in line}
    return ctypes.CDLL(sorted(paths)[0]) if paths else None


@pytest.mark.skipif(loaded_openmp() is None, reason="torch runs without GNU OpenMP here")
def test_each_share_runs_openmp_on_torchs_thread_count() -> None:
    # A new thread's OpenMP team is every core (or OMP_NUM_THREADS) until torch sets it: a count
    # no default has shows whether each share set it before its first op.
    openmp, threads = loaded_openmp(), torch.get_num_threads()
    model, spec = make_model("gru", True, threads=2)
    seen: list[int] = []
    model.encoder.register_forward_pre_hook(
        lambda _m, _args: seen.append(openmp.omp_get_max_threads()))
    torch.set_num_threads(os.cpu_count() + 1)
    try:
        outputs_and_grads(model, spec)
    finally:
        torch.set_num_threads(threads)
    assert seen == [os.cpu_count() + 1] * 2


def test_without_gradients_the_pass_runs_whole_on_the_calling_thread() -> None:
    model, spec = make_model("gru", True, threads=2)
    calls: list[tuple[int, int]] = []
    model.encoder.register_forward_hook(
        lambda _m, args, _out: calls.append((threading.get_ident(), len(args[0]["obs"]))))
    obs, state, dones = batch(spec)
    with torch.no_grad():
        model.forward_sequence(obs, state[:, : model.state_size], dones)
    assert calls == [(threading.get_ident(), BATCH * STEPS)]


def test_an_error_in_another_threads_share_reaches_the_caller() -> None:
    model, spec = make_model("gru", True, threads=2)
    main = threading.get_ident()

    def fail_off_the_main_thread(*_: object) -> None:
        if threading.get_ident() != main:
            raise RuntimeError("share failed")
    model.encoder.register_forward_hook(fail_off_the_main_thread)
    with pytest.raises(RuntimeError, match="share failed"):
        outputs_and_grads(model, spec)


def test_the_learner_splits_its_pass_as_its_setting_says() -> None:
    with pytest.raises(ValueError, match="sequence_threads must be at least 1"):
        Learner.Params(appo=APPO, sequence_threads=0)
    learner = Learner("learner", Learner.Params(appo=APPO, device="cpu", sequence_threads=2))
    learner.build(data=DataPathParams(**SETTINGS))
    assert learner.training.policy.model.sequence_threads == 2
