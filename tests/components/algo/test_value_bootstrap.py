"""value_bootstrap on hand-built trajectories, against references written from the formula.

At a step cut by a time limit (done and time-out) the reward becomes r_t + gamma V(x_t)
(Sample Factory's approximation of the missing V(x_{t+1})); the done stays, so nothing flows
across the cut. A time-out flag without a done is ignored, as Sample Factory's product with the
done ignores it.
"""

from __future__ import annotations

import math

import pytest
import torch

from sfbus_components.algo import AppoConfig, appo_loss, gae, vtrace
from sfbus_components.algo.appo import bootstrap_time_outs
from sfbus_components.models import ActorCritic, ModelConfig

GAMMA, LAM = 0.9, 0.8

# Two trajectories of 4 steps. Row 0: cut by the time limit after step 1. Row 1: a stray
# time-out flag at step 0 (no done: ignored), a termination after step 2, a cut after step 3.
REWARDS = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]]
DONES = [[0, 1, 0, 0], [0, 0, 1, 1]]
TIME_OUTS = [[0, 1, 0, 0], [1, 0, 0, 1]]


def close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    """``actual`` equals ``expected`` to float32 rounding."""
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-6)


def reference_rewards(rewards, values, dones, time_outs, gamma):
    """r_t + gamma V(x_t) where the step was cut by the time limit, else r_t (lists)."""
    return [[r + (gamma * v if d and to else 0.0) for r, v, d, to in zip(*row, strict=True)]
            for row in zip(rewards, values, dones, time_outs, strict=True)]


def reference_gae(rewards, values, bootstrap, dones, gamma, lam):
    """Lambda-returns from A_t = delta_t + gamma lam (1 - d_t) A_{t+1}, one row at a time."""
    out = []
    for r, v, b, d in zip(rewards, values, bootstrap, dones, strict=True):
        steps, adv, row = len(r), 0.0, [0.0] * len(r)
        for t in reversed(range(steps)):
            v_next = v[t + 1] if t + 1 < steps else b
            delta = r[t] + gamma * (1 - d[t]) * v_next - v[t]
            adv = delta + gamma * lam * (1 - d[t]) * adv
            row[t] = adv + v[t]
        out.append(row)
    return out


def reference_vtrace(rewards, values, bootstrap, dones, rhos, gamma):
    """vs_t = V_t + rho_t delta_t + gamma (1 - d_t) c_t (vs_{t+1} - V_{t+1}) (rho-bar = c-bar
    = 1), and the advantages rho_t (r_t + gamma (1 - d_t) vs_{t+1} - V_t)."""
    targets, advantages = [], []
    for r, v, b, d, ratio in zip(rewards, values, bootstrap, dones, rhos, strict=True):
        steps = len(r)
        rho = [min(1.0, x) for x in ratio]
        vs = [0.0] * steps
        for t in reversed(range(steps)):
            v_next = v[t + 1] if t + 1 < steps else b
            delta = rho[t] * (r[t] + gamma * (1 - d[t]) * v_next - v[t])
            carry = (vs[t + 1] - v[t + 1]) if t + 1 < steps else 0.0
            vs[t] = v[t] + delta + gamma * (1 - d[t]) * rho[t] * carry
        vs_next = [*vs[1:], b]
        targets.append(vs)
        advantages.append([rho[t] * (r[t] + gamma * (1 - d[t]) * vs_next[t] - v[t])
                           for t in range(steps)])
    return targets, advantages


def test_a_cut_step_gets_gamma_times_its_value_by_hand() -> None:
    # T = 2, lambda = 1: V = (2, 3), cut after step 1; r' = (1, 1 + 0.9 * 3) = (1, 3.7),
    # G_1 = 3.7 (the done stops the bootstrap value 5), G_0 = 1 + 0.9 * 3.7 = 4.33.
    values, boot = torch.tensor([[2.0, 3.0]]), torch.tensor([5.0])
    dones, cut = torch.tensor([[0.0, 1.0]]), torch.tensor([[0, 1]], dtype=torch.uint8)
    rewards = bootstrap_time_outs(torch.tensor([[1.0, 1.0]]), values, dones, cut, GAMMA)
    close(rewards, [[1.0, 3.7]])
    returns, _ = gae(values, boot, rewards, dones, GAMMA, 1.0)
    close(returns, [[4.33, 3.7]])


def test_bootstrapped_gae_and_vtrace_targets_match_the_formula() -> None:
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(2, 4, generator=gen)
    boot = torch.randn(2, generator=gen)
    log_rhos = torch.randn(2, 4, generator=gen) * 0.5
    dones = torch.tensor(DONES, dtype=torch.float32)
    cut = torch.tensor(TIME_OUTS, dtype=torch.uint8)
    rewards = bootstrap_time_outs(torch.tensor(REWARDS), values, dones, cut, GAMMA)
    expected = reference_rewards(REWARDS, values.tolist(), DONES, TIME_OUTS, GAMMA)
    close(rewards, expected)
    assert rewards[1, 0] == REWARDS[1][0]  # a time-out flag without a done changes nothing

    returns, _ = gae(values, boot, rewards, dones, GAMMA, LAM)
    close(returns, reference_gae(expected, values.tolist(), boot.tolist(), DONES, GAMMA, LAM))
    vs, advantages = vtrace(values, boot, rewards, dones, log_rhos, GAMMA)
    ref_vs, ref_adv = reference_vtrace(expected, values.tolist(), boot.tolist(), DONES,
                                       log_rhos.exp().tolist(), GAMMA)
    close(vs, ref_vs)
    close(advantages, ref_adv)


@pytest.mark.parametrize("with_vtrace", [True, False])
def test_the_loss_trains_on_bootstrapped_targets_when_asked(with_vtrace: bool) -> None:
    torch.manual_seed(0)
    model = ActorCritic({"obs": ((3,), "float32")}, None, 2,
                        ModelConfig(core="none", mlp_layers=(8,)))
    steps = 4
    batch = {
        "obs": {"obs": torch.randn(2, steps + 1, 3)},
        "rnn": torch.zeros(2, 0),
        "actions": torch.randn(2, steps, 2),
        "log_probs": torch.randn(2, steps) - 2.0,
        "action_params": torch.zeros(2, steps, 4),
        "values": torch.randn(2, steps),  # behaviour-time values: GAE's
        "rewards": torch.tensor(REWARDS),
        "dones": torch.tensor(DONES, dtype=torch.uint8),
        "time_outs": torch.tensor(TIME_OUTS, dtype=torch.uint8),
    }
    # The reference: V-trace from the model's own values as the loss computes them, GAE from
    # the behaviour-time values; both bootstrap from the model's V(x_T).
    with torch.no_grad():
        dist, values_all = model.forward_sequence(
            batch["obs"], batch["rnn"], torch.tensor([[*d, 0] for d in DONES]))
        values, boot = values_all[:, :steps].tolist(), values_all[:, steps].tolist()
        rhos = (dist[:, :steps].log_prob(batch["actions"]) - batch["log_probs"]).exp().tolist()

    def figures(value_bootstrap: bool) -> tuple[float, float]:
        cfg = AppoConfig(gamma=GAMMA, gae_lambda=LAM, with_vtrace=with_vtrace,
                         normalize_returns=False, value_bootstrap=value_bootstrap)
        _, stats = appo_loss(model, batch, cfg)
        return float(stats["target_mean"]), float(stats["adv_mean"])

    def mean(rows: list[list[float]]) -> float:
        return math.fsum(x for row in rows for x in row) / sum(len(row) for row in rows)

    if not with_vtrace:
        values = batch["values"].tolist()
    for value_bootstrap in (True, False):
        rewards = (reference_rewards(REWARDS, values, DONES, TIME_OUTS, GAMMA)
                   if value_bootstrap else REWARDS)
        if with_vtrace:
            targets, advantages = reference_vtrace(rewards, values, boot, DONES, rhos, GAMMA)
        else:
            targets = reference_gae(rewards, values, boot, DONES, GAMMA, LAM)
            advantages = [[g - v for g, v in zip(*row, strict=True)]
                          for row in zip(targets, values, strict=True)]
        assert figures(value_bootstrap) == pytest.approx((mean(targets), mean(advantages)),
                                                         abs=1e-6)
    assert figures(True)[0] != pytest.approx(figures(False)[0])


def test_value_bootstrap_without_time_outs_in_the_batch_is_refused() -> None:
    model = ActorCritic({"obs": ((3,), "float32")}, (2,), None,
                        ModelConfig(core="none", mlp_layers=(8,)))
    batch = {"obs": {"obs": torch.randn(1, 3, 3)}, "rnn": torch.zeros(1, 0),
             "actions": torch.zeros(1, 2, 1, dtype=torch.int64), "log_probs": torch.zeros(1, 2),
             "action_params": torch.zeros(1, 2, 2),
             "values": torch.zeros(1, 2), "rewards": torch.zeros(1, 2),
             "dones": torch.zeros(1, 2)}
    with pytest.raises(ValueError, match="value_bootstrap needs the batch's time_outs"):
        appo_loss(model, batch, AppoConfig(normalize_returns=False, value_bootstrap=True))
