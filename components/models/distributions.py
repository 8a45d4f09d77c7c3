"""Action distributions over any leading batch shape (`[B]` at inference, `[B, T]` in training).

Written with plain tensor ops instead of `torch.distributions` to skip argument validation on the
hot path and to keep bf16 autocast working (log_softmax runs in float32 under autocast).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class ActionDistribution:
    """Independent categorical heads (actions int64 `[..., heads]`) or a diagonal Gaussian
    (actions float `[..., dim]`); `log_prob` and `entropy` sum over heads / dimensions."""

    def __init__(
        self,
        *,
        logits: Tensor | None = None,
        action_heads: tuple[int, ...] | None = None,
        mean: Tensor | None = None,
        log_std: Tensor | None = None,
    ) -> None:
        self.action_heads = action_heads
        if logits is not None:
            if action_heads is None or logits.shape[-1] != sum(action_heads):
                raise ValueError(f"logits last dim {logits.shape[-1]} != sum of {action_heads}")
            self.is_categorical = True
            self.logits = logits
            self.log_probs = [
                torch.log_softmax(head.float(), dim=-1)
                for head in logits.split(list(action_heads), dim=-1)
            ]
        elif mean is not None and log_std is not None:
            self.is_categorical = False
            self.mean = mean.float()
            self.log_std = log_std.float().expand_as(self.mean)
        else:
            raise ValueError("give either logits and action_heads, or mean and log_std")

    def __getitem__(self, index: object) -> ActionDistribution:
        """The distribution at `index` of the leading (batch, time) dims, e.g. `dist[:, :T]`."""
        if self.is_categorical:
            return ActionDistribution(logits=self.logits[index], action_heads=self.action_heads)
        return ActionDistribution(mean=self.mean[index], log_std=self.log_std[index])

    @property
    def params(self) -> Tensor:
        """The raw distribution parameters: concatenated logits, or the Gaussian mean."""
        return self.logits if self.is_categorical else self.mean

    def log_prob(self, actions: Tensor) -> Tensor:
        """log pi(a): `[..., heads]` or `[..., dim]` actions -> `[...]` (summed)."""
        if self.is_categorical:
            actions = actions.long()
            per_head = [
                lp.gather(-1, actions[..., i : i + 1]).squeeze(-1)
                for i, lp in enumerate(self.log_probs)
            ]
            return torch.stack(per_head, dim=-1).sum(-1)
        z = (actions.float() - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - _LOG_SQRT_2PI).sum(-1)

    def entropy(self) -> Tensor:
        """H(pi) `[...]`, summed over heads / dimensions."""
        if self.is_categorical:
            per_head = [-(lp.exp() * lp).sum(-1) for lp in self.log_probs]
            return torch.stack(per_head, dim=-1).sum(-1)
        return (self.log_std + 0.5 + _LOG_SQRT_2PI).sum(-1)

    def symmetric_kl_with_uniform(self) -> Tensor:
        """(KL(pi || U) + KL(U || pi)) / 2 `[...]` per categorical head against its uniform
        distribution, summed over heads; categorical heads only."""
        if not self.is_categorical:
            raise ValueError("the symmetric KL to a uniform policy needs categorical actions")
        per_head = []
        for lp in self.log_probs:
            log_uniform = -math.log(lp.shape[-1])
            forward = (lp.exp() * (lp - log_uniform)).sum(-1)
            backward = (math.exp(log_uniform) * (log_uniform - lp)).sum(-1)
            per_head.append(0.5 * (forward + backward))
        return torch.stack(per_head, dim=-1).sum(-1)

    @torch.no_grad()
    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """A random action (no gradient): int64 `[..., heads]` or float `[..., dim]`, drawn from
        ``generator`` (default: torch's global one)."""
        if self.is_categorical:
            heads = []
            for lp in self.log_probs:
                flat = lp.exp().reshape(-1, lp.shape[-1])
                heads.append(torch.multinomial(flat, 1, generator=generator)
                             .reshape(lp.shape[:-1]))
            return torch.stack(heads, dim=-1)
        noise = torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype,
                            device=self.mean.device)
        return self.mean + noise * torch.exp(self.log_std)

    def mode(self) -> Tensor:
        """The most likely action (argmax per head, or the mean) for deterministic play."""
        if self.is_categorical:
            return torch.stack([lp.argmax(-1) for lp in self.log_probs], dim=-1)
        return self.mean

    def kl(self, other: ActionDistribution) -> Tensor:
        """KL(self || other) `[...]`, summed over heads / dimensions."""
        if self.is_categorical:
            per_head = [
                (lp.exp() * (lp - lq)).sum(-1)
                for lp, lq in zip(self.log_probs, other.log_probs, strict=True)
            ]
            return torch.stack(per_head, dim=-1).sum(-1)
        var_ratio = torch.exp(2 * (self.log_std - other.log_std))
        t = ((self.mean - other.mean) * torch.exp(-other.log_std)).pow(2)
        return (0.5 * (var_ratio + t - 1) - (self.log_std - other.log_std)).sum(-1)
