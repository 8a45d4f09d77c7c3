"""PPO loss terms, the APPO config and the combined `appo_loss`."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from sfbus_components.algo import (
    AppoConfig,
    appo_loss,
    gae,
    masked_std_mean,
    normalize_advantages,
    policy_loss,
    value_loss,
    vtrace,
)
from sfbus_components.models import ActorCritic, ModelConfig
from sfbus_components.models.normalizers import ReturnsNormalizer

EPS = 0.1
LOW, HIGH = 1.0 / (1.0 + EPS), 1.0 + EPS


def policy_grad(ratio: float, advantage: float) -> tuple[float, float]:
    """Loss and d loss / d log pi for a single sample with the given ratio."""
    log_prob = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    loss = policy_loss(
        log_prob, torch.zeros(1, dtype=torch.float64), torch.tensor([advantage]), EPS
    )
    loss.backward()
    return loss.item(), log_prob.grad.item()


def test_config_defaults_follow_table_a5():
    cfg = AppoConfig()
    assert (cfg.lr, cfg.gamma, cfg.max_grad_norm) == (1e-4, 0.99, 4.0)
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps) == (0.9, 0.999, 1e-6)
    assert (cfg.entropy_coeff, cfg.value_loss_coeff) == (0.003, 0.5)
    assert cfg.clip_range == pytest.approx((1 / 1.1, 1.1))
    with pytest.raises(ValueError, match="ppo_clip_ratio must be > 0"):
        AppoConfig(ppo_clip_ratio=0.0)


@pytest.mark.parametrize(
    ("ratio", "advantage", "clipped_to"),
    [(1.3, 1.0, HIGH), (0.8, -1.0, LOW), (0.905, -2.0, LOW)],
)
def test_policy_loss_clips_at_the_asymmetric_range(ratio, advantage, clipped_to):
    loss, grad = policy_grad(ratio, advantage)
    assert loss == pytest.approx(-clipped_to * advantage)
    assert grad == 0.0  # clipped: no gradient pushes the ratio further out


@pytest.mark.parametrize(
    ("ratio", "advantage"),
    # 0.905 < 1/1.1: outside the range but a move back inside is still allowed; 0.95, 1.05 inside
    [(0.5, 1.0), (0.905, 1.0), (1.05, 1.0), (0.95, -1.0), (1.3, -1.0), (1.09, 1.0)],
)
def test_policy_loss_unclipped_side_keeps_the_gradient(ratio, advantage):
    loss, grad = policy_grad(ratio, advantage)
    assert loss == pytest.approx(-ratio * advantage)
    # d(-r A)/d log pi = -r A
    assert grad == pytest.approx(-ratio * advantage)


def test_policy_loss_without_clipping_is_importance_weighted():
    log_new = torch.log(torch.tensor([0.5, 2.0, 3.0]))
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss = policy_loss(log_new, torch.zeros(3), adv, None)
    assert loss.item() == pytest.approx(-(0.5 + 2.0 - 3.0) / 3)


def test_value_loss_clipping():
    old, targets = torch.zeros(3), torch.tensor([3.0, -1.0, 0.5])
    new = torch.tensor([2.0, 2.0, 0.2], requires_grad=True)
    loss = value_loss(new, old, targets, clip_value=1.0)
    # per sample max(unclipped, clipped): max(1, 4) = 4, max(9, 4) = 9, max(0.09, 0.09)
    assert loss.item() == pytest.approx((4.0 + 9.0 + 0.09) / 3)
    loss.backward()
    # sample 0 is ruled by the clipped (constant) branch: no gradient
    assert new.grad.tolist() == pytest.approx([0.0, 2 * 3.0 / 3, 2 * -0.3 / 3])
    unclipped = value_loss(new, old, targets, clip_value=None)
    assert unclipped.item() == pytest.approx((1.0 + 9.0 + 0.09) / 3)


def test_normalize_advantages_uses_valid_samples_only():
    adv = torch.tensor([1.0, 2.0, 3.0, 100.0])
    valids = torch.tensor([True, True, True, False])
    out = normalize_advantages(adv, valids)
    assert out[:3].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert out[:3].std().item() == pytest.approx(1.0)


def test_masked_statistics_take_only_valid_samples_and_few_of_them_alike():
    x = torch.tensor([[1.0, 2.0, 3.0], [100.0, -50.0, 7.0]])
    valids = torch.tensor([[True, True, True], [False, False, False]])
    std, mean = masked_std_mean(x, valids)
    assert (std.item(), mean.item()) == pytest.approx((1.0, 2.0))
    one = torch.tensor([[False, True, False], [False, False, False]])
    assert [v.item() for v in masked_std_mean(x, one)] == [0.0, 2.0]  # no spread in one sample
    assert [v.item() for v in masked_std_mean(x, torch.zeros_like(one))] == [0.0, 0.0]
    assert normalize_advantages(x, one).tolist() == (x - 2.0).tolist()  # only centred


def make_batch(model: ActorCritic, batch: int = 3, steps: int = 6, seed: int = 0) -> dict:
    """An on-policy batch of `batch` trajectories sampled from `model` on random observations."""
    gen = torch.Generator().manual_seed(seed)
    obs = {"obs": torch.randn(batch, steps + 1, 4, generator=gen)}
    dones = (torch.rand(batch, steps, generator=gen) < 0.2).float()
    start = torch.randn(batch, model.state_size, generator=gen)
    with torch.no_grad():
        dist, values = model.forward_sequence(obs, start, torch.nn.functional.pad(dones, (0, 1)))
        actions = dist.sample()[:, :steps]
        log_probs = dist[:, :steps].log_prob(actions)
        params = dist[:, :steps].params
    return {
        "obs": obs,
        "rnn": start,
        "actions": actions,
        "log_probs": log_probs,
        "action_params": params,
        "values": values[:, :steps],
        "rewards": torch.randn(batch, steps, generator=gen),
        "dones": dones,
        "versions": torch.full((batch, steps), 10),
        "learner_version": 10,
        "_values_all": values,
    }


@pytest.fixture
def model() -> ActorCritic:
    torch.manual_seed(0)
    cfg = ModelConfig(core="gru", core_size=8, mlp_layers=(8,))
    return ActorCritic({"obs": ((4,), "float32")}, (3, 2), None, cfg)


PLAIN = AppoConfig(normalize_returns=False, normalize_advantage=False, ppo_clip_value=0.0)


@pytest.mark.parametrize("with_vtrace", [True, False])
@pytest.mark.parametrize("with_ppo_clipping", [True, False])
def test_appo_loss_on_policy_matches_hand_computation(model, with_vtrace, with_ppo_clipping):
    batch = make_batch(model)
    cfg = dataclasses.replace(
        PLAIN, with_vtrace=with_vtrace, with_ppo_clipping=with_ppo_clipping, gamma=0.9
    )
    loss, stats = appo_loss(model, batch, cfg)
    values, boot = batch["_values_all"][:, :-1], batch["_values_all"][:, -1]
    args = (values, boot, batch["rewards"], batch["dones"])
    if with_vtrace:
        targets, adv = vtrace(*args, torch.zeros_like(values), 0.9)
    else:
        targets, adv = gae(*args, 0.9, cfg.gae_lambda)
    # on policy the ratio is 1, so every policy-loss variant is -mean(A) (IMPALA's -log pi A
    # has the same gradient but not the same value)
    if with_ppo_clipping or not with_vtrace:
        assert stats["policy_loss"].item() == pytest.approx(-adv.mean().item(), abs=1e-5)
    assert stats["value_loss"].item() == pytest.approx(((values - targets) ** 2).mean().item())
    assert stats["ratio_mean"].item() == pytest.approx(1.0)
    assert stats["kl"].item() == pytest.approx(0.0, abs=1e-6)
    expected = (
        stats["policy_loss"] + 0.5 * stats["value_loss"] - cfg.entropy_coeff * stats["entropy"]
    )
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_appo_loss_masks_samples_beyond_max_policy_lag(model):
    batch = make_batch(model)
    batch["versions"][0] = 0  # first trajectory lags 10 versions behind the learner
    cfg = dataclasses.replace(PLAIN, max_policy_lag=5)
    _, stats = appo_loss(model, batch, cfg)
    assert stats["valid_fraction"].item() == pytest.approx(2 / 3)
    assert stats["policy_lag_max"].item() == 10
    # the same as masking the trajectory explicitly with `valids`
    explicit = dict(batch, valids=torch.ones(3, 6, dtype=torch.bool))
    explicit["valids"][0] = False
    del explicit["learner_version"]
    _, stats_explicit = appo_loss(model, explicit, cfg)
    for key in ("policy_loss", "value_loss", "entropy"):
        assert stats[key].item() == pytest.approx(stats_explicit[key].item())
    _, stats_all = appo_loss(model, batch, AppoConfig(normalize_returns=False))
    assert stats_all["valid_fraction"].item() == 1.0


def test_appo_loss_with_every_sample_masked_is_finite(model):
    batch = make_batch(model)
    batch["versions"][:] = 0
    loss, stats = appo_loss(model, batch, dataclasses.replace(PLAIN, max_policy_lag=5))
    assert stats["valid_fraction"].item() == 0.0
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in stats.values())


def test_appo_loss_accepts_buffer_shaped_fields(model):
    batch = make_batch(model)
    _, stats = appo_loss(model, batch, PLAIN)
    padded = {
        key: torch.cat([value, value[:, -1:]], dim=1)
        if key in ("actions", "log_probs", "action_params", "values", "rewards", "dones")
        else value
        for key, value in batch.items()
    }
    padded["rnn"] = batch["rnn"][:, None].expand(-1, 7, -1)
    _, stats_padded = appo_loss(model, padded, PLAIN)
    assert stats_padded["loss"].item() == pytest.approx(stats["loss"].item())


def test_appo_loss_normalizes_returns(model):
    batch = make_batch(model)
    batch["rewards"] = batch["rewards"] * 100 + 50
    normalizer = ReturnsNormalizer()
    with pytest.raises(ValueError, match=r"cfg\.normalize_returns needs a returns_normalizer"):
        appo_loss(model, batch, AppoConfig())
    appo_loss(model, batch, AppoConfig(), returns_normalizer=normalizer)
    assert normalizer.count.item() == 18 and normalizer.mean.item() > 10
    normalizer.eval()
    before = normalizer.state_dict()["mean"].clone()
    _, stats = appo_loss(model, batch, AppoConfig(), returns_normalizer=normalizer)
    assert normalizer.mean.item() == before.item()  # eval mode reads, never updates
    assert abs(stats["target_mean"].item()) < 5  # targets are in normalized space


@pytest.mark.parametrize(("field", "value", "message"), [
    ("lr", 0.0, "lr must be > 0.0 and <= 1.0, got 0.0"), ("lr", -1e-4, "lr must be > 0.0"),
    ("lr", 1e30, "lr must be > 0.0 and <= 1.0, got 1e+30"),
    ("gamma", 1.5, "gamma must be >= 0.0 and <= 1.0, got 1.5"),
    ("gae_lambda", -0.1, "gae_lambda must be >= 0.0"), ("num_epochs", 0, "num_epochs must be >= 1"),
    ("max_grad_norm", float("nan"), "max_grad_norm must be >= 0.0"),
    ("ppo_clip_ratio", 0.0, "ppo_clip_ratio must be > 0.0"),
])
def test_out_of_range_hyperparameters_are_refused(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        AppoConfig(**{field: value})
    AppoConfig(ppo_clip_value=0.0, entropy_coeff=0.0, gamma=1.0, max_grad_norm=0.0)  # "off"
