"""The learner's gather of one field out of a trajectory buffer, in either of its layouts
(:mod:`sfbus_components.datapath.buffers`; ``TrajectoryBuffer.slot_source`` makes one)."""

from __future__ import annotations

import torch


class SlotSource:
    """One field's first steps of any slots, copied out with one gather (the learner's copy).

    ``[slots, T+1]`` layout: an ``index_select`` over slots of the step-sliced view. Block layout:
    an ``index_select`` over the flat ``(block, t, row)`` rows of every slot's steps.
    """

    def __init__(self, field: torch.Tensor, block_rows: int, slot_steps: int,
                 steps: int | None) -> None:
        self.rows = block_rows
        self.dtype = field.dtype
        self.squeeze = steps is None
        self.steps = 1 if steps is None else steps
        if self.rows:
            feature = field.shape[3:]
            # A view (fails rather than copy); sized explicitly, as a zero-width state has no
            # elements to infer -1 from.
            self.flat = field.view(field.shape[:3].numel(), *feature)
            self.offsets = torch.arange(self.steps) * self.rows
            self.slot_steps = slot_steps
        else:
            feature = field.shape[2:]
            self.source = field[:, 0] if steps is None else field[:, :steps]
        self.shape: tuple[int, ...] = (*(() if self.squeeze else (self.steps,)), *feature)
        """The shape one slot's copy has."""

    def copy_into(self, slots: torch.Tensor, out: torch.Tensor) -> None:
        """Copy ``slots``' steps into ``out`` (contiguous, ``[len(slots), *self.shape]``)."""
        if not self.rows:
            torch.index_select(self.source, 0, slots, out=out)
            return
        block, row = slots.div(self.rows, rounding_mode="floor"), slots.remainder(self.rows)
        # (block * (T+1) + t) * rows + row, for t in [0, steps)
        flat = (block * (self.slot_steps * self.rows) + row).unsqueeze(1) + self.offsets
        torch.index_select(self.flat, 0, flat.view(-1),
                           out=out.view(len(slots) * self.steps, *self.flat.shape[1:]))
