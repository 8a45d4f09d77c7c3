"""The learner's copy of a batch out of shared memory: one gather per field and worker.

A batch names (worker, slot) pairs; the copy groups them by worker and gathers each field of
each worker's slots into one local tensor per field (``[trajectories, ...]``), so that the
workers get their slots back at once in async mode while training reads the copy; copies
alternate between two sets of tensors, so the next batch is copied while one trains. The copy is a
:class:`~sfbus_components.algo.trajectories.Trajectories`, keyed as the buffer's arrays (its
``obs.<key>`` arrays as ``obs[key]``), the names the loss reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from sfbus_components.algo.trajectories import Trajectories
from sfbus_components.datapath.buffers import STEP_FIELDS, SlotSource, TrajectoryBuffer
from sfbus_components.datapath.messages import BatchReady


class BatchCopy:
    """Copies batches out of the workers' trajectory buffers into tensors reused across
    batches: the field's first ``rollout`` steps (observations: ``rollout + 1``, step T
    bootstraps), and the RNN state entering step 0 cut to ``state_size`` (``every_state``: the
    states entering every step, ``[n, rollout + 1, state_size]``, for ``appo.recurrence``)."""

    def __init__(self, buffers: Sequence[TrajectoryBuffer], rollout: int, state_size: int,
                 pin: bool, every_state: bool = False) -> None:
        self.sources = [_source_views(buffer, rollout, state_size, every_state)
                        for buffer in buffers]
        """Per worker, what a batch copies of each field (observations: of each key)."""
        self.pin = pin
        """Allocate the copy in page-locked memory (a GPU learner: its upload then runs
        asynchronously, see TrainingState.to_device)."""
        self._batches: list[Trajectories] = []
        """The two buffers copies alternate between: one batch trains from one while the next
        is copied into the other (the learner trains one batch at a time)."""
        self._copies = 0

    def copy(self, msg: BatchReady) -> tuple[Trajectories, dict[int, list[int]]]:
        """Gather ``msg``'s trajectories into local tensors, one copy (grouped by worker);
        returns the batch and its slots by worker."""
        groups: dict[int, list[int]] = {}
        for worker, slot_index in zip(msg.workers, msg.slots, strict=True):
            groups.setdefault(worker, []).append(slot_index)
        n = len(msg.slots)
        if not self._batches or len(self._batches[0]["rewards"]) != n:
            self._batches = [_map(self.sources[0], lambda source: torch.empty(
                (n, *source.shape), dtype=source.dtype, pin_memory=self.pin)) for _ in range(2)]
        batch = self._batches[self._copies % 2]
        self._copies += 1
        offset = 0
        for worker, slots in groups.items():
            index = torch.tensor(slots, dtype=torch.int64)
            end = offset + len(slots)
            for source, out in _pairs(self.sources[worker], batch):
                source.copy_into(index, out[offset:end])
            offset = end
        return batch, groups


Sources = dict[str, Any]
"""What a batch copies, keyed as :class:`Trajectories`: a ``SlotSource`` per field, and per
observation key under ``obs``."""


def _source_views(buffer: TrajectoryBuffer, steps: int, state_size: int,
                  every_state: bool) -> Sources:
    views: Sources = {"obs": {k: buffer.slot_source(f"obs.{k}", steps + 1)
                              for k in buffer.obs_keys}}
    views.update({f: buffer.slot_source(f, steps) for f in STEP_FIELDS if f != "rnn"})
    views["rnn"] = buffer.slot_source("rnn", steps + 1 if every_state else None, state_size)
    return views


def _map(sources: Sources, make: Callable[[SlotSource], torch.Tensor]) -> Any:
    """``make`` of every source, in the same nesting."""
    return {key: _map(value, make) if isinstance(value, dict) else make(value)
            for key, value in sources.items()}


def _pairs(sources: Sources, batch: Any) -> Iterator[tuple[SlotSource, torch.Tensor]]:
    """Every source with the batch tensor it copies into."""
    for key, value in sources.items():
        if isinstance(value, dict):
            yield from _pairs(value, batch[key])
        else:
            yield value, batch[key]
