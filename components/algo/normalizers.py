"""Running mean / variance normalizers for observations and returns.

Statistics live in float64 buffers, so they travel in `state_dict` and can be copied into a
shared-memory parameter block like the weights. Stats are updated only in training mode (the
learner); inference workers keep their copy in `eval()` mode and only read it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RunningMeanStd(nn.Module):
    """Mean and population variance over every sample seen, merged batch by batch
    (Chan et al.'s parallel form of Welford's algorithm)."""

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, shape: tuple[int, ...] = (), clip: float = 5.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merge the samples of `x [..., *shape]` into the running statistics."""
        batch = x.detach().reshape(-1, *self.shape).to(torch.float64)
        n = batch.shape[0]
        if n == 0:
            return
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        # M2 = M2_a + M2_b + delta^2 n_a n_b / n
        m2 = self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: Tensor) -> Tensor:
        """(x - mean) / sqrt(var + eps), clipped to [-clip, clip], in `x`'s dtype."""
        std = torch.sqrt(self.var + self.eps)
        out = (x.to(torch.float64) - self.mean) / std
        return out.clamp(-self.clip, self.clip).to(x.dtype)

    def denormalize(self, x: Tensor) -> Tensor:
        """x * sqrt(var + eps) + mean, the inverse of `normalize` (without the clip)."""
        std = torch.sqrt(self.var + self.eps)
        return (x.to(torch.float64) * std + self.mean).to(x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        """Update the statistics with `x` in training mode, then normalize it."""
        if self.training:
            self.update(x)
        return self.normalize(x)


class ReturnsNormalizer(RunningMeanStd):
    """Scalar statistics of the value targets: the critic predicts returns in normalized space;
    V-trace / GAE run on denormalized values (Sample Factory's `normalize_returns`)."""

    def __init__(self, clip: float = 5.0, eps: float = 1e-8) -> None:
        super().__init__((), clip=clip, eps=eps)


class ObsNormalizer(nn.Module):
    """Normalizes every float entry of an observation dict; uint8 images pass through untouched
    (the model scales them by 1/255)."""

    def __init__(self, obs_spec: dict[str, tuple[tuple[int, ...], str]], clip: float = 5.0) -> None:
        super().__init__()
        self.stats = nn.ModuleDict(
            {
                key: RunningMeanStd(tuple(shape), clip=clip)
                for key, (shape, dtype) in obs_spec.items()
                if dtype != "uint8"
            }
        )

    def forward(self, obs: dict[str, Tensor]) -> dict[str, Tensor]:
        """A new dict with float entries normalized (stats updated first in training mode)."""
        return {
            key: self.stats[key](value) if key in self.stats else value
            for key, value in obs.items()
        }
