"""Hyperparameters of the actor-critic network (supplement A.1.3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from components.envs.action_bounds import ActionBounds
from components.models.precision import Precision


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the actor-critic network; defaults are the paper's VizDoom model."""

    encoder: str = "auto"
    """A built-in encoder or an import path `package.module:Class` to one of your own
    (docs/MODELS.md). The built-ins encode each observation key the `architecture` reads, images
    `[C, H, W]` with a conv stack and vectors `[D]` with an MLP of `mlp_layers`, concatenated:
    `auto` takes `conv_simple` for images, `conv_simple` / `nature_cnn` name the conv stack
    (`nature_cnn` is the Atari encoder of Mnih et al. (2015), 32 8x8/4, 64 4x4/2, 64 3x3/1,
    then FC `hidden`, for 84x84 frame stacks), `mlp` takes vectors only."""

    hidden: int = 512
    """Width of the fully-connected layer after the conv stack (the encoder's output size)."""

    core: str = "gru"
    """Recurrent core: `gru`, `lstm`, `none`, or an import path `package.module:Class` to one
    of your own (docs/MODELS.md). The paper benchmarks with LSTM and trains its final VizDoom
    agents with GRU ("similar sample efficiency, slightly less computation"); `none` feeds the
    encoder straight to the heads."""

    core_size: int = 512
    """Hidden size of the GRU/LSTM (an LSTM's flat state is `2 * core_size`: h then c)."""

    architecture: Literal["auto", "simplified", "full"] = "auto"
    """Observation keys the built-in encoder reads. `auto`: every key (several keys make it the
    multi-input encoder). `simplified`: `obs` only, the paper's pixels-only model of the
    throughput benchmarks. `full`: `obs` plus the game variables `measurements` through their
    own MLP of `measurements_hidden`, concatenated before the core (Figure A.1). Your own
    encoder reads the keys it wants: leave this at `auto`."""

    measurements_hidden: tuple[int, ...] = (128, 128)
    """Layer widths of the `full` architecture's measurements MLP (Sample Factory's VizDoom
    encoder uses two layers of 128)."""

    mlp_layers: tuple[int, ...] = (64, 64)
    """Layer widths of the `mlp` encoder for vector observations; its output is the last width."""

    nonlinearity: Literal["elu", "relu", "tanh"] = "elu"
    """Activation after every hidden layer (Sample Factory uses ELU throughout)."""

    normalize_input: bool = True
    """Recorded here for the caller: the learner updates `ObsNormalizer`'s running statistics
    (vectors; uint8 images per pixel, Sample Factory's `normalize_input`) *outside* the model.
    Raw uint8 images that reach the model are scaled by 1/255 inside it."""

    precision: Precision = "auto"
    """Arithmetic of the observation encoder (the conv stack is most of the model's compute):
    `bfloat16` runs it under autocast (parameters and the optimizer stay float32), `float32`
    does not, `auto` picks bfloat16 for the conv encoder on CPUs with AMX / AVX-512 BF16 and
    on CUDA devices that support it (float32 for vector observations). The recurrent core and
    the heads always run in float32, so the RNN state and the log-probabilities in the PPO
    ratio keep full precision."""

    adaptive_stddev: bool = False
    """Continuous actions: the Gaussian's log-std is an output of the actor head (state
    dependent), not one learned parameter per action dimension (Sample Factory's
    `adaptive_stddev`; its default is true, its MuJoCo, Atari and Isaac configs set false)."""

    initial_stddev: float = 1.0
    """Continuous actions: the Gaussian's std at initialization (the learned log-std starts at
    `log(initial_stddev)`; with `adaptive_stddev` the log-std outputs' bias does, where Sample
    Factory ignores it)."""

    continuous_tanh_scale: float = 0.0
    """Continuous actions: > 0 bounds the Gaussian's mean to `[-s, s]` as `s * tanh(mean / s)`
    (Sample Factory's `continuous_tanh_scale`, here with `adaptive_stddev` too); 0: unbounded."""

    action_bounds: ActionBounds = "clip"
    """Continuous actions: how a sampled action reaches the env's Box (`clip`, `squash` through
    tanh onto [low, high], or `none`: as sampled, Sample Factory's behaviour); the buffer keeps the
    sample and its log-probability either way (see components/envs/action_bounds.py)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial_stddev) and self.initial_stddev > 0):
            raise ValueError(f"initial_stddev must be > 0 and finite, got {self.initial_stddev}")
        if not (math.isfinite(self.continuous_tanh_scale) and self.continuous_tanh_scale >= 0):
            raise ValueError("continuous_tanh_scale must be >= 0 and finite (0: off), got "
                             f"{self.continuous_tanh_scale}")
        # Imported here: the registry imports the user's module, and the built-in parts import
        # this module.
        from components.models import registry

        for part in ("encoder", "core"):
            registry.resolve(part, getattr(self, part))  # type: ignore[arg-type]
        if self.architecture != "auto" and not registry.is_builtin("encoder", self.encoder):
            raise ValueError(f"architecture '{self.architecture}' chooses the keys of the "
                             f"built-in encoders; encoder '{self.encoder}' reads the keys it "
                             "wants: leave architecture at auto")
        for name in ("hidden", "core_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("mlp_layers", "measurements_hidden"):
            if any(width < 1 for width in getattr(self, name)):
                raise ValueError(f"{name}: every layer width must be >= 1, got "
                                 f"{list(getattr(self, name))}")
