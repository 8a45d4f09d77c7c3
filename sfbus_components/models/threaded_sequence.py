"""The learner's BPTT on a CPU in shares of the batch's trajectories, one thread each, forward
and backward.

Why: on a machine whose cores the rollout processes share, a learner whose ops each run on two
OpenMP threads waits, at every op's barrier, for whichever thread the scheduler took off its
core. Measured in full training on 2 cores with one core partly taken by other work, this split
gave 1.23x the env frames/s of two OpenMP threads per op, and the same on an even machine with
less learner CPU (docs/benchmarks/throughput_cpu.md). Trajectories are independent in the encoder
and the recurrent core, so each share runs its own forward and, when the loss's gradient reaches it,
its own backward; the two meet only where the gradients of the weights add up (an autograd leaf
accumulates under its own lock). The loss, the heads and the optimizer see the whole batch, so
the step computes what the whole-batch step computes, up to the rounding of the gradients'
sums.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

Trunk = Callable[[dict[str, Tensor], Tensor, Tensor], tuple[Tensor, ...]]
"""``(obs [B, T, ...], rnn_state [B, S], dones [B, T]) -> tensors [B, T, ...]``: the part of a
model whose rows are trajectories that do not mix."""


def sequence_in_threads(trunk: Trunk, threads: int, obs: dict[str, Tensor], rnn_state: Tensor,
                        dones: Tensor) -> tuple[Tensor, ...]:
    """``trunk`` over the trajectories in ``threads`` shares, each on its own thread in the
    forward pass and in the backward pass; the outputs are the shares' concatenated."""
    shares = min(threads, dones.shape[0])
    if shares <= 1 or not torch.is_grad_enabled():
        return trunk(obs, rnn_state, dones)
    pieces = [dict(zip(obs, values, strict=True))
              for values in zip(*(v.tensor_split(shares) for v in obs.values()), strict=True)]
    inputs = list(zip(pieces, rnn_state.tensor_split(shares), dones.tensor_split(shares),
                      strict=True))
    # The anchor is what makes autograd call the backward below: no real input needs a gradient.
    anchor = torch.empty(0, requires_grad=True)
    return _Shares.apply(anchor, trunk, inputs)


def run_together(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` at once, each but the first on a new thread with this thread's torch
    thread count; their results, or the first error."""
    threads = torch.get_num_threads()

    def on_torch_threads(call: Callable[[], Any]) -> Any:
        # A new thread's OpenMP team is every core until torch sets it, and oneDNN reads the
        # team's size: its reorders then woke a second OpenMP thread that spun beside the other
        # share (3.5% more CPU a learner step on 2 cores).
        torch.set_num_threads(threads)
        return call()

    with ThreadPoolExecutor(len(calls) - 1) as pool:
        others = [pool.submit(on_torch_threads, call) for call in calls[1:]]
        first = calls[0]()
        return [first, *(future.result() for future in others)]


class _Shares(torch.autograd.Function):
    """The trunk's shares as one autograd node: each share keeps its own graph, and the
    node's backward runs the shares' backward passes side by side."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor, trunk: Trunk,  # type: ignore[override]
                inputs: list[tuple[dict[str, Tensor], Tensor, Tensor]]) -> tuple[Tensor, ...]:
        """Each share's graph, built on its own thread; the outputs joined, without a graph."""
        def share(obs: dict[str, Tensor], state: Tensor, dones: Tensor) -> tuple[Tensor, ...]:
            with torch.enable_grad():  # grad mode is per thread, and off inside a forward
                return tuple(trunk(obs, state, dones))
        ctx.outputs = run_together([lambda args=args: share(*args) for args in inputs])
        return tuple(torch.cat([out[i].detach() for out in ctx.outputs])
                     for i in range(len(ctx.outputs[0])))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[None, None, None]:
        """Each share's backward on its own thread, from its rows of the outputs' gradients."""
        outputs, ctx.outputs = ctx.outputs, None  # the shares' graphs go with this pass
        rows = [out[0].shape[0] for out in outputs]
        split = [g.split(rows) if g is not None else [None] * len(rows) for g in grads]

        def share_backward(index: int) -> None:
            pairs = [(out, g[index]) for out, g in zip(outputs[index], split, strict=True)
                     if g is not None and out.requires_grad]
            if pairs:
                torch.autograd.backward([out for out, _ in pairs], [g for _, g in pairs])
        run_together([lambda index=index: share_backward(index) for index in range(len(rows))])
        return None, None, None
