"""Generalized advantage estimation (Schulman et al., 2016), used when V-trace is off."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def gae(
    values: Tensor,
    bootstrap_value: Tensor,
    rewards: Tensor,
    dones: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Lambda-returns `[B, T]` and GAE advantages `[B, T]`; `dones` as in `vtrace`."""
    rewards = rewards.float()
    values = values.float()
    # discount_t = gamma, or 0 where the episode ended after step t
    discounts = gamma * (1.0 - dones.float())
    values_tp1 = torch.cat([values[:, 1:], bootstrap_value.float().unsqueeze(1)], dim=1)
    # TD error delta_t = r_t + gamma V(x_{t+1}) - V(x_t)
    deltas = rewards + discounts * values_tp1 - values

    # A_t = delta_t + gamma lambda A_{t+1}, computed backwards
    advantages = torch.zeros_like(values)
    acc = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        acc = deltas[:, t] + discounts[:, t] * lam * acc
        advantages[:, t] = acc
    # lambda-return G_t = A_t + V(x_t), the value target
    returns = advantages + values
    return returns, advantages
