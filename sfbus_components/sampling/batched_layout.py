"""Batched sampling (``sampling: batched``): a split's rows are one slice of the buffer, both sides.

Non-batched sampling (the default) lets every row of a split sit in any slot, so the inference
worker gathers the rows a request names from the request table; that is what lets agents act
with different policies. Batched sampling gives up that freedom (one policy per worker) so that
no gather is needed: the slot pool is laid out in blocks of ``rows_per_split`` slots
(:func:`sfbus_components.datapath.buffers.trajectory_layout` rounds it up), a split always takes one
whole free block (``SlotPool.try_acquire_block``), and the buffer fields are laid out
``[block, t, row, ...]``, so the split's rows at step ``t`` are one contiguous array of every
field (``TrajectoryBuffer.at``).

- The rollout side, :class:`BatchedSplit` (a sampling mode of
:mod:`sfbus_components.sampling.splits`),   steps its envs with one call
(:class:`sfbus_components.envs.vector.EnvBatch`) writing straight   into that array and reads the
actions from it; its ``InferenceRequest`` names ``(block, count,   t)``
  (block = its first slot). The call is a native batch's where the env family has one (EnvPool:
  :mod:`sfbus_components.envs.envpool.pool`, the whole split in one call into C++), else a loop over
  the split's envs (:class:`sfbus_components.envs.vector.VectorEnvs`).
- The inference side, :class:`BlockServer`, runs the model on views of the array and writes its
  outputs back by slice assignment (one forward pass per request, as Sample Factory's batched
  mode runs one per worker's batch).

The learner and batcher see slots as usual: a block's slots are submitted and released one by
one, and a block is free again once all of its slots are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from sfbus import SlotPool
from sfbus_components.datapath.buffers import TrajectoryBuffer
from sfbus_components.datapath.messages import InferenceRequest
from sfbus_components.envs.spec import EnvError
from sfbus_components.envs.vector import EnvBatch
from sfbus_components.sampling.splits import Split, SplitWiring

_FIELDS = ("rnn", "actions", "log_probs", "action_params", "values", "versions")


class BatchedSplit(Split):
    """``sampling: batched``: the split fills one block; a step is one slice of every field."""

    def __init__(self, index: int, wiring: SplitWiring) -> None:
        super().__init__(index, wiring)
        if self.buffer.layout.block_rows != self.rows:
            raise ValueError("a batched split needs the block layout (sampling: batched)")
        self.at_rows = slice(0, self.rows)
        """The block's slots (a slice, so that fields give views)."""
        self.batch: EnvBatch = self.vector
        """What one call steps: the envs one by one, or their native batch (``make_batch``)."""

    def make_batch(self) -> bool:
        """Make the split's envs as one native batch reset into the carry, where the env has
        one (EnvPool): then a step is one call into it."""
        batch = self.worker_envs.create_batch(self.vector.first, self.vector.count,
                                              self.carry_obs)
        if batch is not None:
            self.batch = batch
        return batch is not None

    def take_slots(self, pool: SlotPool) -> np.ndarray | None:
        """The first wholly free block of the pool, or None."""
        block = pool.try_acquire_block(self.rows)
        return None if block is None else np.array(block, np.int64)

    def start(self, fresh: np.ndarray) -> None:
        """Fill block ``fresh`` from step 0, every step acted on by the worker's policy."""
        self.at_rows = slice(int(fresh[0]), int(fresh[0]) + self.rows)
        super().start(fresh)
        self._fill_policy()

    def step(self) -> None:
        """Step the envs with one call straight into the block's rows at t+1."""
        t = self.t
        t1 = t + 1
        at, at1 = self.buffer.at(self.at_rows, t), self.buffer.at(self.at_rows, t1)
        obs = {}
        for k, arr in self.obs_items:
            obs[k] = arr[at1]
        rewards, dones, time_outs = self.step_rewards, self.step_dones, self.step_time_outs
        try:
            ended = self.batch.step_rows(self.actions[at], obs, rewards, dones, time_outs)
        except EnvError as error:  # only a native batch raises: VectorEnvs recreates the env
            self.worker_envs.batch_failed(error)
        self.rewards[at] = rewards
        self.dones[at] = dones
        self.time_outs[at] = time_outs
        if ended:
            self._ended(ended, t1)
        self.t = t1

    def request(self, seq: int) -> None:
        """Emit one request naming the block and the step (no request table)."""
        self.awaiting = 1
        self.emit(InferenceRequest(self.worker, self.index, self.rows, self.policy, seq=seq,
                                   block=self.at_rows.start, t=self.t))


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
        """Run ``policy`` (a :class:`~sfbus_components.models.policy.Policy`) on its rows."""
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
            fields["action_params"][at] = out.action_logits.float()
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
        fields["action_params"][at] = 0.0  # uniform logits / the standard normal drawn from
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
