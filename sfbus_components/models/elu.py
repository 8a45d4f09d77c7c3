"""The models' ELU: on CPU through :mod:`native`'s C kernels (3-4x faster than torch's, which
were a fifth of a learner step and a quarter of an inference pass of the paper's model), torch's
ELU wherever those do not run."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from sfbus_components.models import native


class _EluFunction(torch.autograd.Function):
    """ELU with the C kernels forward and backward (its input saved, as torch's ELU saves it)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return native.elu(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        layout = torch.contiguous_format if x.is_contiguous() else torch.channels_last
        grad = grad.contiguous(memory_format=layout)
        if native.runs_on(grad, x):
            return native.elu_backward(grad, x)
        return torch.ops.aten.elu_backward(grad, 1.0, 1, 1, False, x)


def elu(x: Tensor) -> Tensor:
    """``F.elu(x)`` (alpha 1), through the C kernels where they run."""
    if not native.runs_on(x):
        return torch.nn.functional.elu(x)
    if x.requires_grad and torch.is_grad_enabled():
        return _EluFunction.apply(x)
    return native.elu(x)


class ELU(nn.Module):
    """``nn.ELU()`` through :func:`elu`."""

    def forward(self, x: Tensor) -> Tensor:
        """ELU of ``x``."""
        return elu(x)
