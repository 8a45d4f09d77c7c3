"""V-trace targets and policy-gradient advantages (Espeholt et al., 2018, IMPALA, section 4)."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def vtrace(
    values: Tensor,
    bootstrap_value: Tensor,
    rewards: Tensor,
    dones: Tensor,
    log_rhos: Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace `vs [B, T]` and policy-gradient advantages `[B, T]` for `[B, T]` trajectories.

    `dones[:, t]` means the episode ended after step t, so the discount of step t is zero and
    V(x_{t+1}) (or `bootstrap_value` for the last step) is not used. `log_rhos` = log pi - log mu.
    """
    rewards = rewards.float()
    values = values.float()
    # discount_t = gamma, or 0 where the episode ended after step t
    discounts = gamma * (1.0 - dones.float())
    ratios = torch.exp(log_rhos.float())
    # rho_t = min(rho_bar, pi/mu) weights the TD error; c_t = min(c_bar, pi/mu) the trace
    rhos = torch.clamp(ratios, max=rho_bar)
    cs = torch.clamp(ratios, max=c_bar)
    # V(x_{t+1}), with the bootstrap value after the last step
    values_tp1 = torch.cat([values[:, 1:], bootstrap_value.float().unsqueeze(1)], dim=1)
    # delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))
    deltas = rhos * (rewards + discounts * values_tp1 - values)

    # vs_t - V(x_t) = delta_t V + gamma c_t (vs_{t+1} - V(x_{t+1})), computed backwards
    vs_minus_v = torch.zeros_like(values)
    acc = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        acc = deltas[:, t] + discounts[:, t] * cs[:, t] * acc
        vs_minus_v[:, t] = acc
    vs = values + vs_minus_v

    # A_t = rho_t (r_t + gamma vs_{t+1} - V(x_t)), the advantage of the policy gradient
    vs_tp1 = torch.cat([vs[:, 1:], bootstrap_value.float().unsqueeze(1)], dim=1)
    pg_advantages = rhos * (rewards + discounts * vs_tp1 - values)
    return vs, pg_advantages
