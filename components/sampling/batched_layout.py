"""Batched sampling (``sampling: batched``): a split's rows are one slice of the buffer.

Non-batched sampling (the default) lets every row of a split sit in any slot, so the inference
worker gathers the rows a request names from the request table; that is what lets agents act
with different policies. Batched sampling gives up that freedom (one policy per worker) so that
no gather is needed: the slot pool is laid out in blocks of ``rows_per_split`` slots
(:func:`components.datapath.buffers.trajectory_layout` rounds it up), a split always takes one whole
free block, and the buffer fields are laid out ``[block, t, row, ...]``, so the split's rows at step
``t`` are one contiguous array of every field (``TrajectoryBuffer.at``). The rollout worker steps
its envs as one vector (:class:`components.envs.vector.VectorEnvs`) writing straight into that
array and reads the actions from it; an ``InferenceRequest`` names ``(block, count, t)`` (block
= its first slot) and the inference worker runs the model on views of the array and writes its
outputs back by slice assignment (one forward pass per request, as Sample Factory's batched mode
runs one per worker's batch).

The learner and batcher see slots as usual: a block's slots are submitted and released one by
one, and a block is free again once all of its slots are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from components.datapath.buffers import TrajectoryBuffer
from components.datapath.messages import InferenceRequest
from sfbus import ActorContext, SlotPool

_FIELDS = ("rnn", "actions", "log_probs", "values", "versions")


class BlockSlots:
    """A rollout worker's slot pool taken a block of ``rows`` contiguous slots at a time."""

    def __init__(self, context: ActorContext, worker: str, pool: SlotPool, rows: int) -> None:
        if pool.size % rows:
            raise ValueError(f"{worker}: {pool.size} slots are not whole blocks of {rows}")
        self.pool = pool
        self.rows = rows
        # The pool's shared state (0 = free), one row per block.
        self.state = context.shared(f"{pool.name}.state").numpy.reshape(-1, rows)

    def try_acquire(self) -> np.ndarray | None:
        """Take the first wholly free block: its slot indices (ascending), or None."""
        free = np.flatnonzero(~self.state.any(axis=1))
        if not len(free):
            return None
        start = int(free[0]) * self.rows
        block = range(start, start + self.rows)
        # SlotPool hands out slots from its free list only; take these particular ones out of
        # it (O(free slots), once per split per T steps).
        pool: Any = self.pool
        pool._free[:] = [s for s in pool._free if not start <= s < start + self.rows]
        for slot in block:
            pool._take(slot)
        return np.arange(start, start + self.rows, dtype=np.int64)


class BlockServer:
    """The inference worker's side: serves block requests on views of the workers' buffers."""

    def __init__(self, buffers: list[TrajectoryBuffer], state_size: int,
                 action_shape: tuple[int, ...], rng: np.random.Generator,
                 generator: torch.Generator) -> None:
        self.buffers = buffers
        self.obs = [buffer.obs_torch() for buffer in buffers]
        self.torch = [{name: buffer.torch[name] for name in _FIELDS} for buffer in buffers]
        self.numpy = [{name: buffer.numpy[name] for name in _FIELDS} for buffer in buffers]
        self.state_size = state_size
        self.action_shape = action_shape
        self.rng = rng
        """Random actions' draws."""
        self.generator = generator
        """The model's action sampling."""
        self.requests = 0
        """Requests served from a slice (none ever gathered)."""

    def forward(self, policy: Any, request: InferenceRequest, version: int,
                deterministic: bool) -> None:
        """Run ``policy`` (a :class:`components.models.policy.Policy`) on the request's slice."""
        at, at1 = self.at(request)
        fields = self.torch[request.worker]
        obs = {k: v[at] for k, v in self.obs[request.worker].items()}  # views, no copy
        rnn: Tensor = fields["rnn"][at]
        if not self.state_size:
            rnn = rnn[:, :0]
        with torch.inference_mode():
            out = policy.step(obs, rnn, deterministic, self.generator)
            actions = fields["actions"]
            actions[at] = out.actions.reshape(request.count, *self.action_shape).to(
                actions.dtype)
            fields["log_probs"][at] = out.log_prob
            fields["values"][at] = out.value
            fields["versions"][at] = version
            if self.state_size:
                fields["rnn"][at1] = out.rnn_state  # the state after acting at t
        self.requests += 1

    def random(self, request: InferenceRequest, version: int, spec: Any) -> None:
        """Uniform random actions (Gaussian for a Box) into the request's slice."""
        at, at1 = self.at(request)
        n = request.count
        fields = self.numpy[request.worker]
        actions, log_probs = spec.random_actions(self.rng, n)
        fields["actions"][at] = actions
        fields["log_probs"][at] = log_probs
        fields["values"][at] = 0.0
        fields["versions"][at] = version
        if self.state_size:
            fields["rnn"][at1] = 0.0  # a random policy has no state
        self.requests += 1

    def at(self, request: InferenceRequest) -> tuple[tuple, tuple]:
        """Where the request's rows are at its step and the next (contiguous views)."""
        buffer = self.buffers[request.worker]
        rows = slice(request.block, request.block + request.count)
        return buffer.at(rows, request.t), buffer.at(rows, request.t + 1)
