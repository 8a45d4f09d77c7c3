"""The GPU inference step replayed from CUDA graphs (sfbus_components/models/graphed_step.py)
against the eager step; the CUDA cases run where a GPU is visible (bench/gpu_session.sh runs
them)."""

from __future__ import annotations

import functools

import torch

from sfbus_components.datapath.settings import DataPathParams, build_policy
from sfbus_components.models import ModelConfig
from sfbus_components.models.distributions import ActionDistribution
from sfbus_components.models.graphed_step import MIN_ROWS, bucket_rows
from sfbus_components.models.policy import Policy
from tests.devices import CUDA_ONLY

DOOM = DataPathParams(env="doom_basic", model=ModelConfig(hidden=32, core_size=16))
CUDA = torch.device("cuda")
# the encoder computes in bfloat16 on a GPU, and a graph's bucket may pick other kernels than
# a pass of fewer rows
close = functools.partial(torch.testing.assert_close, atol=2e-2, rtol=2e-2)


def test_rows_round_up_to_power_of_two_buckets() -> None:
    assert [bucket_rows(r) for r in (1, MIN_ROWS, 9, 16, 17, 100, 128, 129)] == [
        MIN_ROWS, MIN_ROWS, 16, 16, 32, 128, 128, 256]


def test_cuda_graphs_leave_a_cpu_policy_eager() -> None:
    policy = build_policy(DOOM).prepare_for_inference(cuda_graphs=True)
    assert policy.graphed is None
    obs = {"obs": torch.randint(0, 256, (3, 3, 72, 128), dtype=torch.uint8)}
    with torch.inference_mode():
        out = policy.step(obs, torch.zeros(3, policy.model.state_size))
    assert out.actions.shape == (3, 1)


def policies(seed: int) -> tuple[Policy, Policy]:
    """The same weights on the GPU, eager and replayed from graphs."""
    torch.manual_seed(seed)
    source = build_policy(DOOM)
    source.obs_normalizer({"obs": torch.randint(0, 256, (64, 3, 72, 128), dtype=torch.uint8)})
    pair = []
    for graphs in (False, True):
        policy = build_policy(DOOM)
        policy.load_state_dict(source.state_dict())
        pair.append(policy.prepare_for_inference(device=CUDA, cuda_graphs=graphs))
    return pair[0], pair[1]


def host_rows(rows: int, seed: int, state_size: int) -> tuple[dict, torch.Tensor]:
    """Pinned uint8 frames and states, as an inference worker gathers them."""
    generator = torch.Generator().manual_seed(seed)
    obs = {"obs": torch.randint(0, 256, (rows, 3, 72, 128), dtype=torch.uint8,
                                generator=generator).pin_memory()}
    return obs, torch.randn(rows, state_size, generator=generator).pin_memory()


@CUDA_ONLY
def test_graphed_steps_equal_eager_ones_across_buckets() -> None:
    eager, graphed = policies(0)
    with torch.inference_mode():
        for seed, rows in enumerate((3, 12, 3, 40, MIN_ROWS)):
            obs, state = host_rows(rows, seed, eager.model.state_size)
            want = eager.step(obs, state, deterministic=True)
            got = graphed.step(obs, state, deterministic=True)
            assert got.actions.shape == want.actions.shape == (rows, 1)
            close(got.action_logits, want.action_logits)
            close(got.value, want.value)
            close(got.rnn_state, want.rnn_state)
            # the mode of what the graph computed, whatever a near tie does in bfloat16
            assert torch.equal(got.actions[:, 0], got.action_logits.argmax(-1))
    assert graphed.graphed is not None
    assert {rows for rows, _, _ in graphed.graphed.captures} == {MIN_ROWS, 16, 64}


@CUDA_ONLY
def test_graphed_draws_follow_the_generator_and_its_log_probs() -> None:
    eager, graphed = policies(1)
    obs, state = host_rows(64, 0, eager.model.state_size)
    generator = torch.Generator("cuda").manual_seed(5)
    with torch.inference_mode():
        first = graphed.step(obs, state, generator=generator)
        drawn, log_prob, logits = (first.actions.clone(), first.log_prob.clone(),
                                   first.action_logits.clone())  # the next step reuses them
        second = graphed.step(obs, state, generator=generator)
        assert not torch.equal(drawn, second.actions)  # each replay draws afresh
        behaviour = ActionDistribution.from_params(logits, eager.model.action_heads)
        close(log_prob, behaviour.log_prob(drawn))
        want = eager.step(obs, state, generator=generator)
        close(logits, want.action_logits)
