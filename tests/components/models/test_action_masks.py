"""Action masking (an ``action_mask`` observation key), against the formula
pi(a | mask) = exp(l_a) / sum_{b allowed} exp(l_b) for allowed a, 0 for masked a."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sfbus_components.algo import AppoConfig, appo_loss
from sfbus_components.envs import EnvSpec, ObsField, make_env
from sfbus_components.envs.checks import check_env
from sfbus_components.models import ActorCritic
from sfbus_components.models.config import ModelConfig
from sfbus_components.models.distributions import ActionDistribution
from tests.components.envs.action_envs import LowestAllowed
from tests.short_runs import mean_rewards

HEADS = (4, 3)


def reference_log_probs(logits: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per head: log of exp(l_a) / sum over allowed b of exp(l_b), -inf where masked."""
    out, start = [], 0
    for n in HEADS:
        head, m = logits[..., start:start + n].double(), mask[..., start:start + n].bool()
        norm = torch.log(torch.where(m, head.exp(), 0.0).sum(-1, keepdim=True))
        out.append(torch.where(m, head - norm, -torch.inf))
        start += n
    return out


def test_masked_actions_are_never_drawn_in_100k_draws() -> None:
    torch.manual_seed(0)
    logits = torch.randn(8, sum(HEADS)) * 3
    mask = torch.rand(8, sum(HEADS)) < 0.5
    mask[:, 0] = mask[:, 4] = True  # one allowed action per head at least
    dist = ActionDistribution(logits=logits, action_heads=HEADS, action_mask=mask.to(torch.int8))
    draws = ActionDistribution(
        logits=logits.repeat(12_500, 1), action_heads=HEADS,
        action_mask=mask.repeat(12_500, 1)).sample(torch.Generator().manual_seed(1))
    assert draws.shape == (100_000, 2)
    rows = torch.arange(8).repeat(12_500)
    assert mask[rows, draws[:, 0]].all() and mask[rows, 4 + draws[:, 1]].all()
    # the draws' frequencies follow the renormalised probabilities
    ref = reference_log_probs(logits, mask)
    counts = torch.bincount(rows * 4 + draws[:, 0], minlength=32).reshape(8, 4) / 12_500
    assert torch.allclose(counts.double(), ref[0].exp(), atol=0.02)
    assert (dist.mode()[:, 0] == ref[0].argmax(-1)).all()


def test_log_probs_of_allowed_actions_are_renormalised_and_masked_ones_excluded() -> None:
    torch.manual_seed(1)
    logits = torch.randn(5, sum(HEADS))
    mask = (torch.rand(5, sum(HEADS)) < 0.6).float()  # a float 0/1 mask
    mask[:, 1] = mask[:, 5] = 1.0
    dist = ActionDistribution(logits=logits, action_heads=HEADS, action_mask=mask)
    ref = reference_log_probs(logits, mask)
    for actions in ([1, 1], [0, 1], [1, 2], [3, 1]):
        a = torch.tensor(actions).expand(5, 2)
        allowed = mask[:, a[0, 0]].bool() & mask[:, 4 + a[0, 1]].bool()
        expected = ref[0][:, a[0, 0]] + ref[1][:, a[0, 1]]
        got = dist.log_prob(a).double()
        assert torch.allclose(got[allowed], expected[allowed], atol=1e-5)
        assert (got[~allowed] < -1e8).all()  # a masked action's probability is 0
    p = [r.exp() for r in ref]
    entropy = sum(-(pi * torch.where(pi > 0, pi.log(), 0.0)).sum(-1) for pi in p)
    assert torch.allclose(dist.entropy().double(), entropy, atol=1e-5)
    # the behaviour distribution rebuilt from the stored parameters is the masked one
    again = ActionDistribution.from_params(dist.params, HEADS)
    assert torch.allclose(again.log_prob(torch.tensor([[1, 1]] * 5)),
                          dist.log_prob(torch.tensor([[1, 1]] * 5)))
    assert torch.allclose(dist.kl(again), torch.zeros(5), atol=1e-6)


def test_masked_logits_get_exactly_zero_gradient_through_the_loss() -> None:
    torch.manual_seed(2)
    logits = torch.randn(6, sum(HEADS), requires_grad=True)
    mask = torch.rand(6, sum(HEADS)) < 0.5
    mask[:, 2] = mask[:, 6] = True
    dist = ActionDistribution(logits=logits, action_heads=HEADS, action_mask=mask)
    actions = dist.sample(torch.Generator().manual_seed(3))
    loss = -(dist.log_prob(actions) * torch.randn(6)).sum() - 0.1 * dist.entropy().sum() \
        + dist.kl(ActionDistribution(logits=torch.randn(6, 7), action_heads=HEADS,
                                     action_mask=mask)).sum()
    loss.backward()
    assert (logits.grad[~mask] == 0).all() and (logits.grad[mask] != 0).any()


def test_the_model_and_the_learner_loss_apply_the_mask() -> None:
    """Inference never picks a masked action; the learner's loss over a batch whose stored mask
    masks some actions gives their logits' rows no gradient; the mask is not an encoder input."""
    spec = {"obs": ((3,), "float32"), "action_mask": ((7,), "int8")}
    model = ActorCritic(spec, HEADS, None, ModelConfig(core="none", mlp_layers=(16,)))
    assert model.encoder.keys == ("obs",)
    b, t = 64, 5
    mask = (torch.rand(b, t + 1, 7) < 0.5).to(torch.int8)
    mask[..., 0] = mask[..., 4] = 1
    obs = {"obs": torch.randn(b, t + 1, 3), "action_mask": mask}
    out = model.forward_step({k: v[:, 0] for k, v in obs.items()}, model.initial_state(b))
    assert mask[torch.arange(b), 0, out.actions[:, 0]].all()
    assert mask[torch.arange(b), 0, 4 + out.actions[:, 1]].all()
    assert (out.action_logits[mask[:, 0] == 0] == -1e9).all()
    dist, _ = model.forward_sequence(obs, model.initial_state(b), torch.zeros(b, t + 1))
    actions = dist.sample()[:, :t]
    batch = {"obs": obs, "rnn": model.initial_state(b), "actions": actions,
             "log_probs": dist.log_prob(actions)[:, :t].detach(),
             "action_params": dist.params[:, :t].detach(), "values": torch.zeros(b, t),
             "rewards": torch.randn(b, t), "dones": torch.zeros(b, t),
             "time_outs": torch.zeros(b, t)}
    logits: dict[str, torch.Tensor] = {}

    def keep(module: torch.nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        out.retain_grad()
        logits["raw"] = out

    model.actor.register_forward_hook(keep)
    loss, _ = appo_loss(model, batch, AppoConfig(kl_loss_coeff=0.5, entropy_coeff=0.01,
                                                 normalize_returns=False))
    loss.backward()
    assert torch.isfinite(loss)
    assert (logits["raw"].grad[mask == 0] == 0).all()
    assert (logits["raw"].grad[mask == 1] != 0).any()


def test_gym_dict_observations_become_fields_and_a_bad_mask_is_refused() -> None:
    env = make_env("tests.components.envs.action_envs:make_lowest_allowed")
    spec = check_env(env, "lowest")
    assert spec.observation_space == {"obs": ObsField((1,), "float32"),
                                      "action_mask": ObsField((6,), "float32")}
    obs = env.reset(seed=0)[0]
    assert obs["action_mask"].sum() >= 1 and set(np.unique(obs["action_mask"])) <= {0.0, 1.0}
    env.close()
    with pytest.raises(ValueError, match=r"observation 'action_mask' has shape \[5\], but the "
                                         r"action heads \[4, 3\] need \[7\]"):
        EnvSpec({"obs": ObsField((2,), "float32"), "action_mask": ObsField((5,), "int8")},
                action_heads=HEADS)
    with pytest.raises(ValueError, match="action_mask"):
        EnvSpec({"obs": ObsField((2,), "float32"), "action_mask": ObsField((2,), "int8")},
                action_box=((-1.0, -1.0), (1.0, 1.0), (2,)))


@pytest.mark.multiprocess
def test_a_short_masked_run_learns_and_never_acts_masked(tmp_path: Path) -> None:
    """Random play among the allowed actions scores ~6.5 of 16 per episode, the best play
    without the mask ~0; the run must pass 12."""
    rewards = mean_rewards(tmp_path / "run",
                           "tests.components.envs.action_envs:make_lowest_allowed", 12000,
                           "appo.lr=0.003", timeout=120)
    assert rewards and rewards[-1] > 12.0, rewards


def test_the_test_env_counts_masked_actions() -> None:
    """The env the run uses does punish a masked action (so the run's bar means something)."""
    env = LowestAllowed()
    obs, _ = env.reset(seed=0)
    masked = int(np.flatnonzero(obs["action_mask"] == 0)[0]) if (obs["action_mask"] == 0).any() \
        else None
    if masked is not None:
        assert env.step(masked)[1] == -1.0 and env.masked_chosen == 1
