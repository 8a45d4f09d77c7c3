"""The actor head of continuous actions: a diagonal Gaussian over the action's dimensions.

As Sample Factory 2.x (`sample_factory/model/action_parameterization.py`):

- the mean is a linear map of the core's output, bounded to `[-s, s]` as `s * tanh(mean / s)`
  when `continuous_tanh_scale` s > 0;
- the log-std is one learned parameter per dimension, starting at `log(initial_stddev)`, or with
  `adaptive_stddev` a second linear output (state dependent), its bias starting there;
- the std is kept within `[1e-4, 1e4]` (Sample Factory clamps the std to those bounds), so
  sampling, log-probabilities, entropy and KL all use the same clamped value.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from sfbus_components.models.config import ModelConfig
from sfbus_components.models.distributions import ActionDistribution

LOG_STD_MIN = math.log(1e-4)
LOG_STD_MAX = math.log(1e4)


class GaussianHead(nn.Module):
    """Core output `[..., in_size]` -> an `ActionDistribution` over `action_dim` dimensions."""

    def __init__(self, in_size: int, action_dim: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.adaptive = cfg.adaptive_stddev
        self.tanh_scale = cfg.continuous_tanh_scale
        self.initial_log_std = math.log(cfg.initial_stddev)
        self.linear = nn.Linear(in_size, action_dim * (2 if self.adaptive else 1))
        self.log_std = (None if self.adaptive
                        else nn.Parameter(torch.empty(action_dim)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Orthogonal weights of gain 1 (as the categorical head), zero bias; the log-std (or
        its bias) at `log(initial_stddev)`."""
        nn.init.orthogonal_(self.linear.weight, gain=1.0)
        nn.init.zeros_(self.linear.bias)
        with torch.no_grad():
            if self.log_std is not None:
                self.log_std.fill_(self.initial_log_std)
            else:
                self.linear.bias[self.action_dim:] = self.initial_log_std

    def forward(self, core_out: Tensor) -> ActionDistribution:
        """The Gaussian for core outputs of any leading shape."""
        out = self.linear(core_out)
        if self.log_std is None:
            mean, log_std = out.split(self.action_dim, dim=-1)
        else:
            mean, log_std = out, self.log_std
        if self.tanh_scale > 0:
            mean = torch.tanh(mean / self.tanh_scale) * self.tanh_scale
        return ActionDistribution(mean=mean, log_std=log_std.clamp(LOG_STD_MIN, LOG_STD_MAX))
