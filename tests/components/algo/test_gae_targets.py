"""GAE's targets once per batch (`gae_targets`), from the behaviour-time values and the current
model's V(x_T) run from the stored state, as PPO and Sample Factory compute them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sfbus_components.algo import AppoConfig, appo_loss, gae, gae_targets
from sfbus_components.models import ModelConfig
from sfbus_components.models.actor_critic import ActorCritic
from sfbus_components.models.normalizers import ReturnsNormalizer
from tests.components.algo.test_ppo import make_batch

GAE = AppoConfig(with_vtrace=False, normalize_returns=False, gamma=0.9, gae_lambda=0.8)


@pytest.fixture
def net() -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic({"obs": ((4,), "float32")}, (3, 2), None,
                       ModelConfig(core="gru", core_size=8, mlp_layers=(8,)))


def stored_states(net: ActorCritic, batch: dict) -> torch.Tensor:
    """The state entering every step; the one entering T is left unzeroed after a done at T - 1,
    for gae_targets to zero."""
    obs, dones, state = batch["obs"], batch["dones"], batch["rnn"]
    states = []
    with torch.no_grad():
        for t in range(dones.shape[1] + 1):
            states.append(state)
            _, state = net.core.step(net.encoder({k: v[:, t] for k, v in obs.items()}), state)
            if t + 1 < dones.shape[1]:
                state = state * (1 - dones[:, t : t + 1])
    return torch.stack(states, dim=1)


def test_targets_come_from_the_behaviour_values_and_the_stored_state(net) -> None:
    batch = make_batch(net, batch=4, steps=6)
    batch["dones"][0, -1] = 1.0  # the state entering T is then zeroed
    batch["dones"][1, -1] = 0.0
    batch["values"] = batch["values"] + torch.randn_like(batch["values"])  # stale behaviour
    stored = stored_states(net, batch)
    stored[:, -1] += 0.5 * torch.randn_like(stored[:, -1])  # unzeroed: must not matter for row 0
    targets, advantages = gae_targets(net, {**batch, "rnn": stored}, GAE)

    with torch.no_grad():
        entering = stored[:, -1] * (1 - batch["dones"][:, -1:])
        _, boot = net.forward_sequence({"obs": batch["obs"]["obs"][:, -1:]}, entering,
                                       torch.zeros(4, 1))
    expected_targets, expected_adv = gae(batch["values"], boot[:, 0], batch["rewards"],
                                         batch["dones"], GAE.gamma, GAE.gae_lambda)
    torch.testing.assert_close(targets, expected_targets)
    torch.testing.assert_close(advantages, expected_adv)
    # the model's own values of steps 0..T-1 do not enter: a changed critic moves only V(x_T)
    with torch.no_grad():
        net.critic.bias.add_(1.0)
    moved, _ = gae_targets(net, {**batch, "rnn": stored}, GAE)
    assert not torch.allclose(moved, targets)
    torch.testing.assert_close(moved[0], targets[0])  # done at T - 1: V(x_T) is cut off


def test_the_loss_trains_on_given_targets_as_on_its_own(net) -> None:
    batch = make_batch(net, batch=4, steps=6)
    stored = stored_states(net, batch)
    own, own_stats = appo_loss(net, batch, GAE)
    targets, advantages = gae_targets(net, {**batch, "rnn": stored}, GAE)
    given, given_stats = appo_loss(net, {**batch, "targets": targets, "advantages": advantages},
                                   GAE)
    assert float(given.detach()) == pytest.approx(float(own.detach()), rel=1e-5)
    assert float(given_stats["target_mean"]) == pytest.approx(float(own_stats["target_mean"]),
                                                              rel=1e-5)
    shifted, _ = appo_loss(net, {**batch, "targets": targets + 1.0, "advantages": advantages},
                           GAE)
    assert float(shifted.detach()) != pytest.approx(float(own.detach()), rel=1e-3)


def test_the_returns_statistics_take_the_batch_once(net) -> None:
    batch = make_batch(net, batch=4, steps=6)
    stored = stored_states(net, batch)
    normalizer = ReturnsNormalizer()
    cfg = dataclasses.replace(GAE, normalize_returns=True)
    targets, _ = gae_targets(net, {**batch, "rnn": stored}, cfg, normalizer)
    assert float(normalizer.count) == 4 * 6
    torch.testing.assert_close(normalizer.denormalize(targets).mean(), normalizer.mean.float(),
                               atol=1e-5, rtol=1e-5)
    given = {**batch, "targets": targets, "advantages": torch.zeros_like(targets)}
    appo_loss(net, given, cfg, normalizer)
    assert float(normalizer.count) == 4 * 6  # the minibatch's loss leaves them alone


def test_a_recurrent_model_needs_every_stored_state(net) -> None:
    batch = make_batch(net, batch=2, steps=4)
    with pytest.raises(ValueError, match="state entering each step"):
        gae_targets(net, batch, GAE)


@pytest.mark.parametrize("recurrence", [0, 3], ids=["whole", "in_pieces"])
def test_step_t_apart_leaves_it_out_of_the_loss_pass(net, recurrence) -> None:
    batch = make_batch(net, batch=4, steps=6)
    batch = {**batch, "rnn": stored_states(net, batch)}
    cfg = dataclasses.replace(GAE, recurrence=recurrence)
    obs = batch["obs"]["obs"]
    body = {**batch, "obs": {"obs": obs[:, :6].contiguous()}}  # as the learner normalizes them
    targets, advantages = gae_targets(net, body, cfg, bootstrap_obs={"obs": obs[:, 6:]})
    whole_targets, whole_advantages = gae_targets(net, batch, cfg)
    torch.testing.assert_close(targets, whole_targets)
    torch.testing.assert_close(advantages, whole_advantages)
    rows: list[int] = []
    net.encoder.register_forward_hook(lambda module, args, out: rows.append(out.shape[0]))

    def gradients(loss: torch.Tensor) -> list[torch.Tensor]:
        net.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in net.parameters()]

    given = gradients(appo_loss(net, {**body, "targets": targets, "advantages": advantages},
                                cfg)[0])
    assert sum(rows) == 4 * 6  # V(x_T) came with the targets: step T is not run
    rows.clear()
    own = gradients(appo_loss(net, batch, cfg)[0])
    assert sum(rows) == 4 * 7  # its own GAE needs V(x_T) from this pass
    for a, b in zip(given, own, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_v_trace_refuses_obs_without_step_t(net) -> None:
    batch = make_batch(net, batch=2, steps=4)
    body = {**batch, "obs": {"obs": batch["obs"]["obs"][:, :4]},
            "targets": torch.zeros(2, 4), "advantages": torch.zeros(2, 4)}
    with pytest.raises(ValueError, match="V-trace needs V"):
        appo_loss(net, body, dataclasses.replace(GAE, with_vtrace=True))
