"""APPO hyperparameters (supplement Table A.5) and the PPO loss terms, one named formula each."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

# field: (low, high, low excluded); NaN fails every comparison, so it is refused too
_RANGES = {
    "lr": (0.0, math.inf, True), "gamma": (0.0, 1.0, False), "adam_beta1": (0.0, 1.0, False),
    "adam_beta2": (0.0, 1.0, False), "adam_eps": (0.0, math.inf, True),
    "max_grad_norm": (0.0, math.inf, True), "num_epochs": (1, math.inf, False),
    "num_batches_per_epoch": (1, math.inf, False), "vtrace_rho_bar": (0.0, math.inf, True),
    "vtrace_c_bar": (0.0, math.inf, True), "ppo_clip_ratio": (0.0, math.inf, True),
    "ppo_clip_value": (0.0, math.inf, False), "entropy_coeff": (0.0, math.inf, False),
    "value_loss_coeff": (0.0, math.inf, False), "gae_lambda": (0.0, 1.0, False),
    "max_policy_lag": (0, math.inf, False),
}


@dataclass(frozen=True)
class AppoConfig:
    """Learner hyperparameters; defaults are Table A.5 (VizDoom) unless a field says otherwise."""

    lr: float = 1e-4
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount (the paper uses 0.995 with frameskip 2 in Deathmatch and Duel)."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.999
    """Adam beta2."""
    adam_eps: float = 1e-6
    """Adam epsilon."""
    max_grad_norm: float = 4.0
    """Clip the global gradient norm to this (0 disables)."""
    num_epochs: int = 1
    """Passes over each training batch."""
    num_batches_per_epoch: int = 1
    """Minibatches one accumulated batch is split into per epoch."""
    vtrace_rho_bar: float = 1.0
    """V-trace rho-bar: truncation of the importance weight on the TD error and the advantage."""
    vtrace_c_bar: float = 1.0
    """V-trace c-bar: truncation of the importance weight on the trace."""
    ppo_clip_ratio: float = 0.1
    """eps of the paper's asymmetric clipping range [1/(1+eps), 1+eps] = [1/1.1, 1.1]."""
    ppo_clip_value: float = 1.0
    """Largest change of the value estimate from its behavior-time value before the value loss is
    clipped (Sample Factory's default 1.0, in normalized-return space); 0 disables."""
    entropy_coeff: float = 0.003
    """Weight of the entropy bonus (Sample Factory's `exploration_loss_coeff`)."""
    value_loss_coeff: float = 0.5
    """Weight of the critic loss (no extra 1/2 inside the squared error, as in Sample Factory)."""
    gae_lambda: float = 0.95
    """GAE lambda, used only when V-trace is off."""
    with_vtrace: bool = True
    """V-trace targets and advantages; off: GAE on the current model's values."""
    with_ppo_clipping: bool = True
    """PPO clipped surrogate; off: a plain importance-weighted policy gradient."""
    normalize_returns: bool = True
    """Critic predicts returns normalized by running statistics (`ReturnsNormalizer`)."""
    normalize_advantage: bool = True
    """Standardize advantages over each minibatch's valid samples."""
    max_policy_lag: int = 100
    """Samples whose policy lag (learner version - behavior version) exceeds this are masked out
    of every loss term (Sample Factory 1.x default 100; they still feed V-trace's recursion)."""

    def __post_init__(self) -> None:
        for name, (low, high, low_open) in _RANGES.items():
            value = getattr(self, name)
            if not (low < value if low_open else low <= value) or not value <= high:
                bound = f"> {low}" if low_open else f">= {low}"
                raise ValueError(f"{name} must be {bound}" + (f" and <= {high}"
                                 if high != math.inf else "") + f", got {value}")

    @property
    def clip_range(self) -> tuple[float, float]:
        """The ratio clipping range `(1/(1+eps), 1+eps)`."""
        high = 1.0 + self.ppo_clip_ratio
        return 1.0 / high, high


def masked_mean(x: Tensor, valids: Tensor | None = None) -> Tensor:
    """Mean of `x` over the entries where `valids` is true (all when `valids` is None)."""
    if valids is None:
        return x.mean()
    valids = valids.to(x.dtype)
    return (x * valids).sum() / valids.sum().clamp_min(1.0)


def normalize_advantages(
    advantages: Tensor, valids: Tensor | None = None, eps: float = 1e-7
) -> Tensor:
    """A <- (A - mean A) / max(std A, eps), statistics over the valid samples."""
    selected = advantages if valids is None else advantages[valids.bool()]
    if selected.numel() < 2:
        return advantages - selected.mean() if selected.numel() else advantages
    std, mean = torch.std_mean(selected)
    return (advantages - mean) / std.clamp_min(eps)


def policy_loss(
    log_prob_new: Tensor,
    log_prob_old: Tensor,
    advantages: Tensor,
    clip_ratio: float | None,
    valids: Tensor | None = None,
) -> Tensor:
    """PPO's clipped surrogate with the range [1/(1+eps), 1+eps]; `clip_ratio=None` gives the
    unclipped importance-weighted surrogate -ratio * A."""
    # importance ratio r = pi(a|x) / mu(a|x)
    ratio = torch.exp(log_prob_new - log_prob_old)
    if clip_ratio is None:
        return -masked_mean(ratio * advantages, valids)
    # asymmetric range, so that clipping is symmetric in log space: log r in [-log(1+eps), +]
    high = 1.0 + clip_ratio
    low = 1.0 / high
    # L = -E[min(r A, clip(r, low, high) A)]
    surrogate = torch.min(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    return -masked_mean(surrogate, valids)


def impala_policy_loss(
    log_prob_new: Tensor, advantages: Tensor, valids: Tensor | None = None
) -> Tensor:
    """IMPALA's policy gradient -log pi(a|x) * A, for V-trace advantages that already carry the
    truncated importance weight rho_t (so no second ratio is applied)."""
    return -masked_mean(log_prob_new * advantages, valids)


def value_loss(
    values_new: Tensor,
    values_old: Tensor,
    targets: Tensor,
    clip_value: float | None,
    valids: Tensor | None = None,
) -> Tensor:
    """Critic loss E[(V - target)^2]; with `clip_value`, PPO2's max of the clipped and unclipped
    squared errors, the clipped value being V_old + clip(V - V_old, -c, c)."""
    unclipped = (values_new - targets).pow(2)
    if clip_value is None:
        return masked_mean(unclipped, valids)
    values_clipped = values_old + torch.clamp(values_new - values_old, -clip_value, clip_value)
    clipped = (values_clipped - targets).pow(2)
    return masked_mean(torch.max(unclipped, clipped), valids)


def entropy_loss(entropy: Tensor, valids: Tensor | None = None) -> Tensor:
    """-E[H(pi)]: minimizing it maximizes the policy's entropy."""
    return -masked_mean(entropy, valids)
