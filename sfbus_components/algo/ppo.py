"""APPO hyperparameters (supplement Table A.5) and the PPO loss terms, one named formula each."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from sfbus_components.algo.lr_schedule import LrScheduleName

# field: (low, high, low excluded); NaN fails every comparison, so it is refused too
_RANGES = {
    "lr": (0.0, 1.0, True), "gamma": (0.0, 1.0, False), "adam_beta1": (0.0, 1.0, False),
    "adam_beta2": (0.0, 1.0, False), "adam_eps": (0.0, math.inf, True),
    "max_grad_norm": (0.0, math.inf, False), "num_epochs": (1, math.inf, False),
    "num_batches_per_epoch": (1, math.inf, False), "vtrace_rho_bar": (0.0, math.inf, True),
    "vtrace_c_bar": (0.0, math.inf, True), "ppo_clip_ratio": (0.0, math.inf, True),
    "ppo_clip_value": (0.0, math.inf, False), "entropy_coeff": (0.0, math.inf, False),
    "value_loss_coeff": (0.0, math.inf, False), "gae_lambda": (0.0, 1.0, False),
    "max_policy_lag": (0, math.inf, False), "recurrence": (0, math.inf, False),
    "lr_schedule_kl_threshold": (0.0, math.inf, True),
    "lr_adaptive_min": (0.0, math.inf, True), "lr_adaptive_max": (0.0, math.inf, True),
    "reward_clip": (0.0, math.inf, True), "kl_loss_coeff": (0.0, math.inf, False),
}


@dataclass(frozen=True)
class AppoConfig:
    """Learner hyperparameters; defaults are Table A.5 (VizDoom) unless a field says otherwise."""

    lr: float = 1e-4
    """Learning rate (the initial one under a schedule)."""
    optimizer: Literal["adam", "lamb"] = "adam"
    """Adam, or LAMB (layer-wise trust ratio, :mod:`sfbus_components.algo.lamb`); both take the
    `adam_*` settings."""
    lr_schedule: LrScheduleName = "constant"
    """`constant`; `linear_decay` to 0 over `--max-frames`; `kl_adaptive_minibatch` /
    `kl_adaptive_epoch`: /1.5 or x1.5 after each minibatch / epoch by its mean KL
    (:mod:`sfbus_components.algo.lr_schedule`). PBT changes `lr` only under `constant`."""
    lr_schedule_kl_threshold: float = 0.008
    """The KL the adaptive schedules aim at: above 2x it the rate falls, below 1/2 it rises."""
    lr_adaptive_min: float = 1e-6
    """Lowest rate of the adaptive schedules."""
    lr_adaptive_max: float = 1e-2
    """Highest rate of the adaptive schedules."""
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
    """Weight of the exploration loss (Sample Factory's `exploration_loss_coeff`)."""
    exploration_loss: Literal["entropy", "symmetric_kl"] = "entropy"
    """The entropy bonus, or the symmetric KL divergence between the policy and the uniform
    one (categorical actions only; clamped at 30 as Sample Factory)."""
    kl_loss_coeff: float = 0.0
    """Weight of the KL penalty E[KL(pi || mu)] against the behaviour policy (Schulman et al.
    2017's fixed-KL variant; Sample Factory recommends 0.1 for continuous actions)."""
    reward_clip: float = 1000.0
    """Rewards are clipped to [-c, c] after scaling (Sample Factory's default 1000)."""
    value_loss_coeff: float = 0.5
    """Weight of the critic loss (no extra 1/2 inside the squared error, as in Sample Factory)."""
    gae_lambda: float = 0.95
    """GAE lambda, used only when V-trace is off."""
    with_vtrace: bool = True
    """V-trace targets and advantages (per minibatch, from the current model); off: GAE, once per
    batch from the behaviour-time values (PPO's and Sample Factory's way)."""
    with_ppo_clipping: bool = True
    """PPO clipped surrogate; off: a plain importance-weighted policy gradient."""
    normalize_returns: bool = True
    """Critic predicts returns normalized by running statistics (`ReturnsNormalizer`)."""
    normalize_advantage: bool = True
    """Standardize advantages over each minibatch's valid samples."""
    shuffle_minibatches: bool = True
    """Deal each epoch's trajectories into minibatches at random; off: in buffer order, the same
    minibatches every epoch (Sample Factory's default is off)."""
    value_bootstrap: bool = False
    """At a time-limit truncation add gamma * V(x_t) to the reward of the step cut: the episode
    did not end there, so its return goes on (Sample Factory's `value_bootstrap`, off by default
    as there; the buffer's `time_outs` say which steps were cut). The done stays, so the
    recurrence still stops and the RNN state is reset."""
    recurrence: int = 0
    """Steps of back-propagation through time: the learner's forward pass runs each trajectory
    in pieces of this many steps, each from the RNN state stored for its first step (Sample
    Factory's `recurrence`; targets are still computed over whole trajectories); 0: the whole
    rollout in one piece. Must divide the rollout."""
    max_policy_lag: int = 100
    """Samples whose policy lag (learner version - behavior version) exceeds this are masked out
    of every loss term (Sample Factory 1.x default 100; they still feed V-trace's recursion)."""

    def __post_init__(self) -> None:
        if self.lr_adaptive_min > self.lr_adaptive_max:
            raise ValueError(f"lr_adaptive_min {self.lr_adaptive_min} is above lr_adaptive_max "
                             f"{self.lr_adaptive_max}")
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


def masked_std_mean(x: Tensor, valids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(unbiased std, mean) of `x` over the entries where `valids` is true; the std is 0 with
    fewer than two of them, the mean 0 with none. Masked sums, not a selection of the entries:
    selecting needs their count on the host, which on a GPU waits for every queued kernel."""
    if valids is None:
        valids = torch.ones_like(x, dtype=torch.bool)
    weights = valids.to(x.dtype)
    count = weights.sum()
    mean = (x * weights).sum() / count.clamp_min(1.0)
    variance = (((x - mean) * weights) ** 2).sum() / (count - 1.0).clamp_min(1.0)
    return torch.where(count > 1, variance.sqrt(), 0.0), mean


def normalize_advantages(
    advantages: Tensor, valids: Tensor | None = None, eps: float = 1e-7
) -> Tensor:
    """A <- (A - mean A) / max(std A, eps), statistics over the valid samples (with fewer than
    two, only the mean is taken off)."""
    std, mean = masked_std_mean(advantages, valids)
    centred = advantages - mean
    if valids is None:
        return centred / std.clamp_min(eps) if advantages.numel() > 1 else centred
    return torch.where(valids.sum() > 1, centred / std.clamp_min(eps), centred)


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


SYMMETRIC_KL_CAP = 30.0  # Sample Factory's clamp: a collapsed head must not dominate the loss


def symmetric_kl_loss(symmetric_kl: Tensor, valids: Tensor | None = None) -> Tensor:
    """E[(KL(pi || U) + KL(U || pi)) / 2], capped at 30 (0 if not finite): minimizing it keeps
    the policy near uniform, Sample Factory's `symmetric_kl` exploration loss."""
    mean = masked_mean(symmetric_kl, valids)
    return torch.where(torch.isfinite(mean), mean, torch.zeros_like(mean)).clamp(
        max=SYMMETRIC_KL_CAP)
