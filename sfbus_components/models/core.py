"""Recurrent core with a flat `[B, state_size]` state, so it fits one shared-memory field.

The built-in cores (`gru`, `lstm`, `none`) below follow the protocol a user's core follows too
(docs/MODELS.md): built as `Core(in_size, cfg)`, with `state_size_for(cfg)` (a class method: the
data path sizes its buffers before any model exists), `out_size`, `step` and `sequence`.

State conventions (shared by `step` and `sequence`):

- GRU of `L = rnn_num_layers` layers: the state is `cat([h_0, ..., h_{L-1}], dim=1)`,
  `state_size == L * core_size`.
- LSTM: the state is `cat([h_0, ..., h_{L-1}, c_0, ..., c_{L-1}], dim=1)`,
  `state_size == 2 * L * core_size` (one layer: `[h, c]`).
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

from sfbus_components.models.config import ModelConfig
from sfbus_components.models.gru_sequence import gru_sequence
from sfbus_components.models.precision import Precision, uses_bf16


def gru_cell(gates_x: Tensor, gates_h: Tensor, h: Tensor) -> Tensor:
    """``nn.GRU``'s cell from the input's and the state's gate pre-activations ``[B, 3H]``
    (r, z, n; biases included): n = tanh(x_n + r * h_n), the new state (1 - z) * n + z * h."""
    size = h.shape[1]
    reset, update = torch.sigmoid(gates_x[:, : 2 * size] + gates_h[:, : 2 * size]).chunk(2, 1)
    new = torch.tanh(torch.addcmul(gates_x[:, 2 * size :], reset, gates_h[:, 2 * size :]))
    return torch.lerp(new, h, update)


class Core(nn.Module):
    """GRU / LSTM of ``rnn_num_layers`` stacked layers (or identity) over encoder features: the
    built-in cores, each registered by name (``gru``, ``lstm``, ``none``) as one of the
    subclasses below."""

    kind: ClassVar[str]
    """``gru``, ``lstm`` or ``none``."""
    products_precision: Precision = "float32"
    """Arithmetic of the GRU's matrix products in :meth:`sequence` on a CPU (the learner's
    BPTT); the actor-critic sets its encoder's precision here. Gates and state stay float32."""

    def __init__(self, in_size: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.rnn: nn.GRU | nn.LSTM | None = None
        if self.kind == "gru":
            self.rnn = nn.GRU(in_size, cfg.core_size, cfg.rnn_num_layers, batch_first=True)
        elif self.kind == "lstm":
            self.rnn = nn.LSTM(in_size, cfg.core_size, cfg.rnn_num_layers, batch_first=True)
        self.core_size = cfg.core_size
        self.num_layers = cfg.rnn_num_layers
        self.out_size = cfg.core_size if self.rnn is not None else in_size
        self.state_size = self.state_size_for(cfg)

    @classmethod
    def state_size_for(cls, cfg: ModelConfig) -> int:
        """Width of the flat state for ``cfg`` (the data path sizes its buffers with it)."""
        layers = cfg.rnn_num_layers * cfg.core_size
        return {"gru": layers, "lstm": 2 * layers, "none": 0}[cls.kind]

    def _layers(self, flat: Tensor) -> Tensor:
        """`[B, L * H]` (layer-major) -> torch's `[L, B, H]`."""
        return flat.reshape(len(flat), self.num_layers, self.core_size).transpose(0, 1).contiguous()

    @staticmethod
    def _flat(layers: Tensor) -> Tensor:
        """torch's `[L, B, H]` -> `[B, L * H]`."""
        return layers.transpose(0, 1).reshape(layers.shape[1], -1)

    def _run(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Run the RNN over `x [B, T, H]` from the flat `state [B, S]`."""
        assert self.rnn is not None
        if self.kind == "lstm":
            h, c = state.chunk(2, dim=1)
            out, (h, c) = self.rnn(x, (self._layers(h), self._layers(c)))
            return out, torch.cat([self._flat(h), self._flat(c)], dim=1)
        out, h = self.rnn(x, self._layers(state))
        return out, self._flat(h)

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
        # the steps some trajectory's episode ended before (read on the host: on a GPU a wait
        # for every queued kernel, so not for one step, which has none)
        resets = ((dones[:, : num_steps - 1] != 0).any(dim=0).nonzero().flatten() + 1).tolist() \
            if num_steps > 1 else []
        state = state.to(x.dtype)
        if self.kind == "gru" and x.device.type == "cpu":
            return self._gru_on_cpu(x, state, keep, set(resets))
        # One cuDNN call per stretch with no reset in any trajectory instead of T cell calls:
        # split T only at those steps.
        bounds = [0, *resets, num_steps]
        outputs = []
        for start, end in itertools.pairwise(bounds):
            if start > 0:
                state = state * keep[:, start - 1 : start]
            out, state = self._run(x[:, start:end], state)
            outputs.append(out)
        return torch.cat(outputs, dim=1)

    def _gru_on_cpu(self, x: Tensor, state: Tensor, keep: Tensor, resets: set[int]) -> Tensor:
        """The GRU's layers over ``x [B, T, in]`` through :func:`gru_sequence`, with no cut at
        the ``resets``; the matrix products in ``products_precision`` (bfloat16 on a CPU with
        bfloat16 instructions: there the float32 products were a quarter of the learner's step,
        docs/benchmarks/throughput_cpu.md, and their rounding adds less to the gradients than
        the bfloat16 encoder does), the gates and state in float32."""
        assert self.rnn is not None
        products = torch.bfloat16 if uses_bf16(self.products_precision, x.device) \
            else torch.float32
        for layer, h in enumerate(self._layers(state)):
            weights = tuple(getattr(self.rnn, f"{name}_l{layer}") for name in
                            ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            x = gru_sequence(x, h, keep, resets, weights, products)
        return x


class GruCore(Core):
    """The GRU core (``core: gru``), the paper's final VizDoom agents'."""

    kind = "gru"


class LstmCore(Core):
    """The LSTM core (``core: lstm``): state ``[h, c]``."""

    kind = "lstm"


class IdentityCore(Core):
    """No core (``core: none``): the encoder's features go straight to the heads."""

    kind = "none"
