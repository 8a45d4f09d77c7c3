"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), as Sample Factory 2.x
offers it beside Adam (``optimizer: lamb``).

Per parameter tensor: Adam's moments without bias correction (the paper's v3), the Adam step
``m / (sqrt(v) + eps)``, and a layer-wise trust ratio ``||w|| / ||step||`` (``||w||`` clamped
to [0, 10]; 1 where either norm is 0) that scales the step: ``w <- w - lr * ratio * step``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

_MAX_WEIGHT_NORM = 10.0


class Lamb(torch.optim.Optimizer):
    """LAMB with Adam's ``lr``, ``betas`` and ``eps`` (no weight decay: the learner uses none)."""

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One LAMB update of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(param.grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(param.grad, param.grad, value=1.0 - beta2)
                adam_step = exp_avg / (exp_avg_sq.sqrt() + group["eps"])
                weight_norm = param.norm().clamp(0.0, _MAX_WEIGHT_NORM)
                step_norm = adam_step.norm()
                trust = torch.where((weight_norm > 0) & (step_norm > 0),
                                    weight_norm / step_norm, torch.ones_like(weight_norm))
                param.sub_(adam_step * (group["lr"] * trust))
        return loss
