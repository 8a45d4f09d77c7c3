"""Recurrent core with a flat `[B, state_size]` state, so it fits one shared-memory field.

The built-in cores (`gru`, `lstm`, `none`) below follow the protocol a user's core follows too
(docs/MODELS.md): built as `Core(in_size, cfg)`, with `state_size_for(cfg)` (a class method: the
data path sizes its buffers before any model exists), `out_size`, `step` and `sequence`.

State conventions (shared by `step` and `sequence`):

- GRU: the state is `h`, `state_size == core_size`.
- LSTM: the state is `cat([h, c], dim=1)`, `state_size == 2 * core_size`.
- none: the state is an empty `[B, 0]` tensor, `state_size == 0`.

`step` never resets anything: whoever owns the episode (the rollout worker) writes zeros into the
state when an episode starts. `sequence` replays that rule inside a trajectory: `dones[:, t]`
means the episode ended *after* step t, so the state entering step t + 1 is multiplied by
`1 - dones[:, t]`. The state entering step 0 is used as given.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

import torch
from torch import Tensor, nn

from components.models.config import ModelConfig


class Core(nn.Module):
    """Single-layer GRU / LSTM (or identity) over encoder features: the built-in cores, each
    registered by name (``gru``, ``lstm``, ``none``) as one of the subclasses below."""

    kind: ClassVar[str]
    """``gru``, ``lstm`` or ``none``."""

    def __init__(self, in_size: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.rnn: nn.GRU | nn.LSTM | None = None
        if self.kind == "gru":
            self.rnn = nn.GRU(in_size, cfg.core_size, batch_first=True)
        elif self.kind == "lstm":
            self.rnn = nn.LSTM(in_size, cfg.core_size, batch_first=True)
        self.core_size = cfg.core_size
        self.out_size = cfg.core_size if self.rnn is not None else in_size
        self.state_size = self.state_size_for(cfg)

    @classmethod
    def state_size_for(cls, cfg: ModelConfig) -> int:
        """Width of the flat state for ``cfg`` (the data path sizes its buffers with it)."""
        return {"gru": cfg.core_size, "lstm": 2 * cfg.core_size, "none": 0}[cls.kind]

    def _run(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Run the RNN over `x [B, L, H]` from the flat `state [B, S]`."""
        assert self.rnn is not None
        if self.kind == "lstm":
            h, c = state.unsqueeze(0).chunk(2, dim=2)
            out, (h, c) = self.rnn(x, (h.contiguous(), c.contiguous()))
            return out, torch.cat([h, c], dim=2).squeeze(0)
        out, h = self.rnn(x, state.unsqueeze(0).contiguous())
        return out, h.squeeze(0)

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step: features `[B, H]`, state `[B, S]` -> output `[B, out]`, new state `[B, S]`."""
        if self.rnn is None:
            return x, state
        out, new_state = self._run(x.unsqueeze(1), state.to(x.dtype))
        return out.squeeze(1), new_state

    def sequence(self, x: Tensor, state: Tensor, dones: Tensor) -> Tensor:
        """BPTT over `x [B, T, H]` from `state [B, S]`, resetting after `dones [B, T]`."""
        if self.rnn is None:
            return x
        num_steps = x.shape[1]
        keep = 1.0 - dones.to(x.dtype)
        # One cuDNN call per stretch with no reset in any trajectory instead of T cell calls:
        # split T only where some trajectory's episode ended on the previous step.
        resets = (dones[:, : num_steps - 1] != 0).any(dim=0).nonzero().flatten() + 1
        bounds = [0, *resets.tolist(), num_steps]
        state = state.to(x.dtype)
        outputs = []
        for start, end in itertools.pairwise(bounds):
            if start > 0:
                state = state * keep[:, start - 1 : start]
            out, state = self._run(x[:, start:end], state)
            outputs.append(out)
        return torch.cat(outputs, dim=1)


class GruCore(Core):
    """The GRU core (``core: gru``), the paper's final VizDoom agents'."""

    kind = "gru"


class LstmCore(Core):
    """The LSTM core (``core: lstm``): state ``[h, c]``."""

    kind = "lstm"


class IdentityCore(Core):
    """No core (``core: none``): the encoder's features go straight to the heads."""

    kind = "none"
