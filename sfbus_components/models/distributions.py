"""Action distributions over any leading batch shape (`[B]` at inference, `[B, T]` in training).

Written with plain tensor ops instead of `torch.distributions` to skip argument validation on the
hot path and to keep bf16 autocast working (log_softmax runs in float32 under autocast).

Action masking (as Sample Factory 2.x's categorical distribution with an ``action_mask``): a
masked action's logit is replaced by ``MASKED_LOGIT`` before the softmax, so its probability is
exactly 0 (never sampled), the allowed actions' probabilities are renormalised among themselves,
and no gradient reaches the raw logit it replaced. The masked logits are the distribution's
:attr:`~ActionDistribution.params`, so the behaviour distribution rebuilt from them is masked too.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
MASKED_LOGIT = -1e9
"""A masked action's logit: finite (so ``0 * log p`` terms of entropy and KL stay 0, where -inf
gives NaN), and far enough below any real logit that ``exp`` of it underflows to exactly 0."""


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
        action_mask: Tensor | None = None,
    ) -> None:
        self.action_heads = action_heads
        if logits is not None:
            if action_heads is None or logits.shape[-1] != sum(action_heads):
                raise ValueError(f"logits last dim {logits.shape[-1]} != sum of {action_heads}")
            if action_mask is not None:
                logits = mask_logits(logits, action_mask)
            self.is_categorical = True
            self.logits = logits
            self.head_log_probs = torch.log_softmax(_by_head(logits.float(), action_heads), -1)
            """Every head's log-probabilities in one tensor ``[..., heads, max choices]``, a
            shorter head's tail padded with probability 0: one op per step for all heads
            instead of one per head (7 heads for Doom's full action space)."""
        elif mean is not None and log_std is not None:
            self.is_categorical = False
            self.mean = mean.float()
            self.log_std = log_std.float().expand_as(self.mean)
            if action_mask is not None:
                raise ValueError("an action mask needs categorical actions")
        else:
            raise ValueError("give either logits and action_heads, or mean and log_std")

    def __getitem__(self, index: object) -> ActionDistribution:
        """The distribution at `index` of the leading (batch, time) dims, e.g. `dist[:, :T]`."""
        if self.is_categorical:
            return ActionDistribution(logits=self.logits[index], action_heads=self.action_heads)
        return ActionDistribution(mean=self.mean[index], log_std=self.log_std[index])

    @property
    def params(self) -> Tensor:
        """The distribution's parameters `[..., n]`: the heads' logits, or the Gaussian's mean
        and log-std concatenated (what :meth:`from_params` rebuilds it from)."""
        if self.is_categorical:
            return self.logits
        return torch.cat([self.mean, self.log_std], dim=-1)

    @staticmethod
    def from_params(params: Tensor, action_heads: tuple[int, ...] | None,
                    action_dim: int | None = None) -> ActionDistribution:
        """The distribution whose :attr:`params` are ``params``: categorical with
        ``action_heads``, a Gaussian without, hybrid with both ``action_heads`` and a Box of
        ``action_dim`` dimensions."""
        if action_heads is not None and action_dim is not None:
            logits, mean, log_std = params.split([sum(action_heads), action_dim, action_dim], -1)
            return HybridDistribution(
                ActionDistribution(logits=logits, action_heads=action_heads),
                ActionDistribution(mean=mean, log_std=log_std))
        if action_heads is not None:
            return ActionDistribution(logits=params, action_heads=action_heads)
        mean, log_std = params.chunk(2, dim=-1)
        return ActionDistribution(mean=mean, log_std=log_std)

    @property
    def log_probs(self) -> list[Tensor]:
        """Each categorical head's log-probabilities ``[..., its choices]`` (views)."""
        assert self.action_heads is not None
        return [self.head_log_probs[..., head, :choices]
                for head, choices in enumerate(self.action_heads)]

    def log_prob(self, actions: Tensor) -> Tensor:
        """log pi(a): `[..., heads]` or `[..., dim]` actions -> `[...]` (summed)."""
        if self.is_categorical:
            chosen = self.head_log_probs.gather(-1, actions.long().unsqueeze(-1))
            return chosen.squeeze(-1).sum(-1)
        z = (actions.float() - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - _LOG_SQRT_2PI).sum(-1)

    def entropy(self) -> Tensor:
        """H(pi) `[...]`, summed over heads / dimensions."""
        if self.is_categorical:
            lp = self.head_log_probs
            return -(lp.exp() * lp).sum((-2, -1))
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
            # torch.multinomial's own one-sample path (argmax of p / q, q ~ Exp(1)): the same
            # draws from the same generator, without its ~10 operations of validity checks on
            # probabilities a softmax made, which cost more than the draw at inference's few
            # rows (on a GPU each is a kernel launch the host pays for).
            probs = self.head_log_probs.exp()
            race = torch.empty_like(probs).exponential_(generator=generator)
            return probs.div_(race).argmax(-1)
        noise = torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype,
                            device=self.mean.device)
        return self.mean + noise * torch.exp(self.log_std)

    def mode(self) -> Tensor:
        """The most likely action (argmax per head, or the mean) for deterministic play."""
        if self.is_categorical:
            return self.head_log_probs.argmax(-1)
        return self.mean

    def kl(self, other: ActionDistribution) -> Tensor:
        """KL(self || other) `[...]`, summed over heads / dimensions."""
        if self.is_categorical:
            lp, lq = self.head_log_probs, other.head_log_probs
            return (lp.exp() * (lp - lq)).sum((-2, -1))
        var_ratio = torch.exp(2 * (self.log_std - other.log_std))
        t = ((self.mean - other.mean) * torch.exp(-other.log_std)).pow(2)
        return (0.5 * (var_ratio + t - 1) - (self.log_std - other.log_std)).sum(-1)


class HybridDistribution(ActionDistribution):
    """Independent categorical heads and a diagonal Gaussian in one action (a gymnasium Tuple of
    Discrete spaces and a Box): actions float `[..., heads + dim]`, the heads' choices as whole
    numbers, then the Box's values. The parts are independent, so log-probabilities, entropies
    and KLs add; the parameters are the logits, then the mean, then the log-std."""

    is_categorical = False

    def __init__(self, categorical: ActionDistribution, gaussian: ActionDistribution) -> None:
        if not categorical.is_categorical or gaussian.is_categorical:
            raise ValueError("a hybrid distribution is a categorical one and a Gaussian")
        self.categorical = categorical
        self.gaussian = gaussian
        self.action_heads = categorical.action_heads
        self.num_heads = len(categorical.action_heads)
        # the parts' parameters under the names the single distributions use
        self.logits = categorical.logits
        self.mean = gaussian.mean
        self.log_std = gaussian.log_std

    def __getitem__(self, index: object) -> HybridDistribution:
        """The distribution at `index` of the leading (batch, time) dims."""
        return HybridDistribution(self.categorical[index], self.gaussian[index])

    @property
    def params(self) -> Tensor:
        """The logits, the mean and the log-std concatenated `[..., sum(heads) + 2 * dim]`."""
        return torch.cat([self.logits.float(), self.mean, self.log_std], dim=-1)

    def log_prob(self, actions: Tensor) -> Tensor:
        """log pi(a) = the heads' log-probabilities plus the Gaussian's, `[...]`."""
        return (self.categorical.log_prob(actions[..., :self.num_heads])
                + self.gaussian.log_prob(actions[..., self.num_heads:]))

    def entropy(self) -> Tensor:
        """H(pi) = the heads' entropies plus the Gaussian's, `[...]`."""
        return self.categorical.entropy() + self.gaussian.entropy()

    def symmetric_kl_with_uniform(self) -> Tensor:
        """Refused: a Gaussian has no uniform distribution to compare with."""
        raise ValueError("the symmetric KL to a uniform policy needs categorical actions only")

    @torch.no_grad()
    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """A random action (no gradient), float `[..., heads + dim]`."""
        choices = self.categorical.sample(generator).to(self.mean.dtype)
        return torch.cat([choices, self.gaussian.sample(generator)], dim=-1)

    def mode(self) -> Tensor:
        """The most likely action: each head's argmax, then the mean."""
        return torch.cat([self.categorical.mode().to(self.mean.dtype), self.mean], dim=-1)

    def kl(self, other: ActionDistribution) -> Tensor:
        """KL(self || other) `[...]` against another hybrid distribution: the parts' KLs added."""
        if not isinstance(other, HybridDistribution):
            raise TypeError("the KL of a hybrid distribution needs another hybrid one")
        return self.categorical.kl(other.categorical) + self.gaussian.kl(other.gaussian)


_PADDED_LOGIT = 2 * MASKED_LOGIT
"""A padding entry's logit: below a masked action's, so that even a head whose every action
is masked gives its padding probability 0."""


def _padding_index(action_heads: tuple[int, ...], device: torch.device) -> Tensor:
    """Where each entry of ``[heads, max choices]`` reads from the logits followed by one
    padding column (index ``sum(action_heads)``)."""
    if torch.compiler.is_compiling():
        # A trace (sfbus export) makes a fake tensor here: cached, it would reach the next trace.
        return _index_tensor(action_heads, device)
    return _cached_index_tensor(action_heads, device)


def _index_tensor(action_heads: tuple[int, ...], device: torch.device) -> Tensor:
    width, pad = max(action_heads), sum(action_heads)
    index, start = [], 0
    for choices in action_heads:
        index += [*range(start, start + choices), *[pad] * (width - choices)]
        start += choices
    with torch.inference_mode(False):  # first built in an inference step, later saved for backward
        return torch.tensor(index, device=device)


_cached_index_tensor = functools.cache(_index_tensor)


def _by_head(logits: Tensor, action_heads: tuple[int, ...]) -> Tensor:
    """``logits [..., sum(heads)]`` as ``[..., heads, max choices]``, shorter heads padded."""
    width = max(action_heads)
    if all(choices == width for choices in action_heads):
        return logits.unflatten(-1, (len(action_heads), width))
    padding = logits.new_full((*logits.shape[:-1], 1), _PADDED_LOGIT)
    index = _padding_index(tuple(action_heads), logits.device)
    return torch.cat([logits, padding], -1).index_select(-1, index).unflatten(
        -1, (len(action_heads), width))


def mask_logits(logits: Tensor, action_mask: Tensor) -> Tensor:
    """``logits`` with every action whose mask entry is not positive set to ``MASKED_LOGIT``
    (``action_mask`` of any dtype, 1 / True = allowed, broadcast against ``logits``)."""
    if action_mask.shape[-1] != logits.shape[-1]:
        raise ValueError(f"action mask of width {action_mask.shape[-1]} for "
                         f"{logits.shape[-1]} logits")
    return logits.masked_fill(action_mask <= 0, MASKED_LOGIT)
