"""A model of one's own, the worked example of docs/MODELS.md: an encoder and a recurrent core
that sfbus loads by import path (``examples.custom_model:LayerNormEncoder``) in every process.

Run it with ``examples/custom_model.yaml`` (CartPole, about a minute on a laptop core).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sfbus_components.models import ModelConfig


class LayerNormEncoder(nn.Module):
    """Every vector observation key, concatenated, through Linear + LayerNorm + tanh layers of
    ``cfg.mlp_layers`` (the encoder reads the model's own settings like a built-in)."""

    def __init__(self, obs_spec: dict[str, tuple[tuple[int, ...], str]], cfg: ModelConfig) -> None:
        super().__init__()
        for key, (shape, _dtype) in obs_spec.items():
            if len(shape) != 1:
                raise ValueError(f"LayerNormEncoder reads vectors, '{key}' has shape {shape}")
        self.keys = sorted(obs_spec)
        size = sum(obs_spec[key][0][0] for key in self.keys)
        layers: list[nn.Module] = []
        for width in cfg.mlp_layers:
            layers += [nn.Linear(size, width), nn.LayerNorm(width), nn.Tanh()]
            size = width
        self.net = nn.Sequential(*layers)
        self.out_size = size  # the protocol: the width of forward's output

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        """``[N, out_size]`` features of the (normalized, float) observations ``[N, ...]``."""
        return self.net(torch.cat([obs[key] for key in self.keys], dim=1))


class GruCellCore(nn.Module):
    """A GRU stepped cell by cell: the contract of the built-in cores (flat state ``[B, S]``,
    ``sequence`` zeroing the state after each done)."""

    @classmethod
    def state_size_for(cls, cfg: ModelConfig) -> int:
        """The flat state's width, from the config alone: the data path sizes buffers with it."""
        return cfg.core_size

    def __init__(self, in_size: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.cell = nn.GRUCell(in_size, cfg.core_size)
        self.out_size = cfg.core_size

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step: ``x [B, in]``, ``state [B, S]`` -> (output ``[B, out]``, new state)."""
        h = self.cell(x, state)
        return h, h

    def sequence(self, x: Tensor, state: Tensor, dones: Tensor) -> Tensor:
        """``x [B, T, in]`` from ``state [B, S]``; ``dones[:, t]`` zeroes the state entering
        step t + 1. Returns ``[B, T, out]``."""
        outputs = []
        for t in range(x.shape[1]):
            if t > 0:
                state = state * (1.0 - dones[:, t - 1 : t])
            state = self.cell(x[:, t], state)
            outputs.append(state)
        return torch.stack(outputs, dim=1)
