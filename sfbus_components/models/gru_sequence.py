"""A one-layer GRU over a batch of trajectories on a CPU, with the backward pass written out.

Why: the learner's BPTT on a CPU. ``nn.GRU`` (oneDNN's RNN) runs a stretch of steps in one call
but must be cut wherever an episode ends in any trajectory, and Atari's episodic lives end one
every ~40 steps: with 16 trajectories of 32 steps a share, ~12 cuts, each stretch paying the
input's product and the weights' gradients again on a few rows. Autograd over a loop of GRU
cells needs no cuts, but adds every step's weight gradient as a product of 16 rows. Here the
input's gates are one product over all the steps, the loop carries only the state's product,
and the backward pass gathers every step's gate gradients so that the weights' and the input's
gradients are three products over all the steps (Atari's shape, AVX2, one share's forward and
backward: 84 ms cut as ``nn.GRU`` needs, 58 ms here, 58 ms with no cut at all).

The forward pass computes what :func:`~sfbus_components.models.core.gru_cell` computes, its
ops in the same order, so a step's outputs equal the loop's; the gradients are the GRU's up to
the rounding of their sums. The matrix products run in ``products`` (float32, or bfloat16 with
float32 results as the learner's bfloat16 BPTT computes them); gates and state stay float32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def gru_sequence(x: Tensor, state: Tensor, keep: Tensor, resets: set[int],
                 weights: tuple[Tensor, Tensor, Tensor, Tensor],
                 products: torch.dtype = torch.float32) -> Tensor:
    """The outputs ``[B, T, H]`` of a GRU layer (``weights``: ``nn.GRU``'s ``weight_ih``,
    ``weight_hh``, ``bias_ih``, ``bias_hh``) over ``x [B, T, in]`` from ``state [B, H]``, the
    state entering each step ``t`` of ``resets`` multiplied by ``keep[:, t - 1]``."""
    return _GruSequence.apply(x, state, keep, resets, products, *weights)


def _product(a: Tensor, b: Tensor, dtype: torch.dtype) -> Tensor:
    """``a @ b`` in ``dtype``, float32 out."""
    return torch.mm(a.to(dtype), b.to(dtype)).float()


class _GruSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, state: Tensor, keep: Tensor, resets: set[int],
                products: torch.dtype, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
                b_hh: Tensor) -> Tensor:
        batch, steps, size = x.shape[0], x.shape[1], state.shape[1]
        low = products != torch.float32
        # the input's share of every step's gates in one product; biases in the products'
        # dtype, as nn.functional.linear adds them there
        gates_x = torch.addmm(b_ih.to(products), x.reshape(batch * steps, -1).to(products),
                              w_ih.to(products).t()).float().view(batch, steps, 3 * size)
        w_hh_t, b_hh_p = w_hh.to(products).t(), b_hh.to(products)
        entering = torch.empty(batch, steps, size)
        gates = torch.empty(batch, steps, 3 * size)  # r, z (after the sigmoid), n (after tanh)
        state_n = torch.empty(batch, steps, size)  # the state's share of n's pre-activation
        out = torch.empty(batch, steps, size)
        h = state.float()
        for t in range(steps):
            if t in resets:
                h = h * keep[:, t - 1 : t]
            entering[:, t] = h
            gates_h = torch.addmm(b_hh_p, h.to(products) if low else h, w_hh_t).float()
            step_gates = gates[:, t]
            torch.add(gates_x[:, t, : 2 * size], gates_h[:, : 2 * size],
                      out=step_gates[:, : 2 * size]).sigmoid_()
            reset, update = step_gates[:, :size], step_gates[:, size : 2 * size]
            state_n[:, t] = gates_h[:, 2 * size :]
            torch.addcmul(gates_x[:, t, 2 * size :], reset, gates_h[:, 2 * size :],
                          out=step_gates[:, 2 * size :]).tanh_()
            h = torch.lerp(step_gates[:, 2 * size :], h, update, out=out[:, t])
        ctx.save_for_backward(x, keep, w_ih, w_hh, entering, gates, state_n)
        ctx.resets, ctx.products = resets, products
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, keep, w_ih, w_hh, entering, gates, state_n = ctx.saved_tensors
        products = ctx.products
        batch, steps, size = entering.shape
        grad_x_gates = torch.empty(batch, steps, 3 * size)  # the pre-activations' gradients
        grad_h_gates = torch.empty(batch, steps, 3 * size)
        w_hh_p = w_hh.to(products)
        grad_h = torch.zeros(batch, size)
        for t in range(steps - 1, -1, -1):
            grad_h = grad_h + grad_out[:, t]
            step = gates[:, t]
            reset, update, new = step[:, :size], step[:, size : 2 * size], step[:, 2 * size :]
            # h = n + z * (h_in - n)
            grad_new = grad_h * (1.0 - update)
            grad_update = grad_h * (entering[:, t] - new)
            # n = tanh(x_n + r * h_n); r, z = sigmoid(...)
            grad_new.mul_(1.0 - new * new)
            grad_reset = grad_new * state_n[:, t]
            gx, gh = grad_x_gates[:, t], grad_h_gates[:, t]
            torch.mul(grad_reset, reset * (1.0 - reset), out=gx[:, :size])
            torch.mul(grad_update, update * (1.0 - update), out=gx[:, size : 2 * size])
            gx[:, 2 * size :] = grad_new
            gh[:, : 2 * size] = gx[:, : 2 * size]
            torch.mul(grad_new, reset, out=gh[:, 2 * size :])
            grad_h = torch.addcmul(_product(gh, w_hh_p, products), grad_h, update)
            if t in ctx.resets:
                grad_h = grad_h * keep[:, t - 1 : t]
        flat_x_gates = grad_x_gates.view(batch * steps, -1)
        flat_h_gates = grad_h_gates.view(batch * steps, -1)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(flat_x_gates, w_ih, products).view(*x.shape[:2], -1).to(x.dtype)
        grad_w_ih = _product(flat_x_gates.t(), x.reshape(batch * steps, -1), products)
        grad_w_hh = _product(flat_h_gates.t(), entering.view(batch * steps, -1), products)
        return (grad_x, grad_h.to(entering.dtype) if ctx.needs_input_grad[1] else None, None,
                None, None, grad_w_ih, grad_w_hh, flat_x_gates.sum(0), flat_h_gates.sum(0))
