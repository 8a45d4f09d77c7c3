"""The learner's copy of a batch out of shared memory: one gather per field and worker.

A batch names (worker, slot) pairs; the copy groups them by worker and gathers each field of
each worker's slots into one local tensor per field (``[trajectories, ...]``), so that the
workers get their slots back at once in async mode while training reads the copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sfbus_components.datapath.buffers import STEP_FIELDS, SlotSource, TrajectoryBuffer
from sfbus_components.datapath.messages import BatchReady
from sfbus_components.learning.appo_update import Batch


class BatchCopy:
    """Copies batches out of the workers' trajectory buffers into tensors reused across
    batches: the field's first ``rollout`` steps (observations: ``rollout + 1``, step T
    bootstraps), and the RNN state entering step 0 cut to ``state_size`` (``every_state``: the
    states entering every step, ``[n, rollout + 1, state_size]``, for ``appo.recurrence``)."""

    def __init__(self, buffers: Sequence[TrajectoryBuffer], rollout: int, state_size: int,
                 pin: bool, every_state: bool = False) -> None:
        self.sources = [_source_views(buffer, rollout, state_size, every_state)
                        for buffer in buffers]
        """Per worker, what a batch copies of each field."""
        self.pin = pin
        """Allocate the copy in page-locked memory (a GPU learner: its upload then runs
        asynchronously, see TrainingState.to_device)."""
        self._batch: Batch | None = None

    def copy(self, msg: BatchReady) -> tuple[Batch, dict[int, list[int]]]:
        """Gather ``msg``'s trajectories into local tensors, one copy (grouped by worker);
        returns the batch and its slots by worker."""
        groups: dict[int, list[int]] = {}
        for worker, slot_index in zip(msg.workers, msg.slots, strict=True):
            groups.setdefault(worker, []).append(slot_index)
        n = len(msg.slots)
        if self._batch is None or len(self._batch["rewards"]) != n:
            # Reused across batches: the learner's mailbox runs one batch at a time, and
            # training reads it only until the next copy starts.
            self._batch = {k: torch.empty((n, *v.shape), dtype=v.dtype, pin_memory=self.pin)
                           for k, v in self.sources[0].items()}
        offset = 0
        for worker, slots in groups.items():
            index = torch.tensor(slots, dtype=torch.int64)
            end = offset + len(slots)
            for key, source in self.sources[worker].items():
                source.copy_into(index, self._batch[key][offset:end])
            offset = end
        return self._batch, groups


def _source_views(buffer: TrajectoryBuffer, steps: int, state_size: int,
                  every_state: bool) -> dict[str, SlotSource]:
    views = {f"obs.{k}": buffer.slot_source(f"obs.{k}", steps + 1) for k in buffer.obs_keys}
    views.update({f: buffer.slot_source(f, steps) for f in STEP_FIELDS if f != "rnn"})
    views["rnn"] = buffer.slot_source("rnn", steps + 1 if every_state else None, state_size)
    return views
