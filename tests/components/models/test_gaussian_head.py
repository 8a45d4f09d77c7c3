"""The continuous action head against its formulas: learned or adaptive log-std, initial std,
tanh scale, the std clamp; and the log-probabilities of what it samples."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal

from sfbus_components.models import ActorCritic, ModelConfig
from sfbus_components.models.gaussian_head import GaussianHead

DIM, IN = 3, 5


def head(**settings: object) -> GaussianHead:
    torch.manual_seed(0)
    return GaussianHead(IN, DIM, ModelConfig(**settings))


def test_the_learned_log_std_starts_at_the_initial_std_whatever_the_state() -> None:
    h = head(initial_stddev=0.5)
    x = torch.randn(4, IN)
    dist = h(x)
    assert len(list(h.parameters())) == 3  # weight, bias, one log-std per dimension
    torch.testing.assert_close(dist.log_std, torch.full((4, DIM), math.log(0.5)))
    torch.testing.assert_close(dist.mean, x @ h.linear.weight.T + h.linear.bias)
    actions = torch.randn(4, DIM)
    torch.testing.assert_close(dist.log_prob(actions),
                               Normal(dist.mean, 0.5).log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(), Normal(dist.mean, 0.5).entropy().sum(-1))


def test_the_adaptive_std_comes_from_the_network_starting_at_the_initial_std() -> None:
    h = head(adaptive_stddev=True, initial_stddev=2.0)
    assert h.log_std is None and h.linear.out_features == 2 * DIM
    x = torch.randn(4, IN)
    out = x @ h.linear.weight.T + h.linear.bias
    dist = h(x)
    torch.testing.assert_close(dist.mean, out[:, :DIM])
    torch.testing.assert_close(dist.log_std, out[:, DIM:])
    assert not torch.allclose(dist.log_std[0], dist.log_std[1])  # state dependent
    torch.testing.assert_close(h.linear.bias[DIM:], torch.full((DIM,), math.log(2.0)))
    # Zero input: exactly the initial std.
    torch.testing.assert_close(h(torch.zeros(1, IN)).log_std, torch.full((1, DIM), math.log(2.0)))


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_tanh_scale_bounds_the_mean(adaptive: bool) -> None:
    h = head(continuous_tanh_scale=0.7, adaptive_stddev=adaptive)
    with torch.no_grad():
        h.linear.weight.mul_(50.0)  # means far outside the scale
    x = torch.randn(64, IN)
    raw = (x @ h.linear.weight.T + h.linear.bias)[:, :DIM]
    mean = h(x).mean
    torch.testing.assert_close(mean, 0.7 * torch.tanh(raw / 0.7))
    assert mean.abs().max() <= 0.7 and raw.abs().max() > 5.0


def test_the_std_is_clamped_to_sample_factorys_bounds_everywhere() -> None:
    h = head()
    x = torch.randn(2, IN)
    actions = torch.randn(2, DIM)
    for log_std, std in ((50.0, 1e4), (-50.0, 1e-4)):
        with torch.no_grad():
            h.log_std.fill_(log_std)
        dist = h(x)
        torch.testing.assert_close(dist.log_std.exp(), torch.full((2, DIM), std))
        reference = Normal(dist.mean, std)
        torch.testing.assert_close(dist.log_prob(dist.mean + std * actions),
                                   reference.log_prob(dist.mean + std * actions).sum(-1))
        torch.testing.assert_close(dist.entropy(), reference.entropy().sum(-1))


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_sampled_action_is_scored_by_the_distribution_it_came_from(adaptive: bool) -> None:
    torch.manual_seed(0)
    model = ActorCritic({"obs": ((4,), "float32")}, None, DIM,
                        ModelConfig(core="none", mlp_layers=(8,), adaptive_stddev=adaptive,
                                    initial_stddev=0.3, continuous_tanh_scale=1.5))
    obs = {"obs": torch.randn(6, 4)}
    step = model.forward_step(obs, torch.zeros(6, 0), generator=torch.Generator().manual_seed(1))
    # The learner's view of the same steps (a sequence of one step) gives the same log mu.
    dist, _ = model.forward_sequence({"obs": obs["obs"].unsqueeze(1)}, torch.zeros(6, 0),
                                     torch.zeros(6, 1))
    torch.testing.assert_close(dist.log_prob(step.actions.unsqueeze(1)).squeeze(1),
                               step.log_prob)
    reference = Normal(dist.mean.squeeze(1), dist.log_std.squeeze(1).exp())
    torch.testing.assert_close(step.log_prob, reference.log_prob(step.actions).sum(-1))


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("initial_stddev", 0.0, "initial_stddev must be > 0"),
    ("initial_stddev", math.inf, "initial_stddev must be > 0 and finite"),
    ("continuous_tanh_scale", -1.0, "continuous_tanh_scale must be >= 0"),
    ("continuous_tanh_scale", math.nan, "continuous_tanh_scale must be >= 0"),
])
def test_bad_head_settings_are_refused(setting: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{setting: value})
