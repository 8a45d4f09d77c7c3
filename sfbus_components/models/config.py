"""Hyperparameters of the actor-critic network (supplement A.1.3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from sfbus_components.envs.action_bounds import ActionBounds
from sfbus_components.models.precision import Precision


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the actor-critic network; defaults are the paper's VizDoom model."""

    encoder: str = "auto"
    """A built-in encoder or an import path `package.module:Class` to one of your own
    (docs/MODELS.md). The built-ins encode each observation key the `architecture` reads, images
    `[C, H, W]` with a conv stack and vectors `[D]` with an MLP of `mlp_layers`, concatenated:
    `auto` takes `conv_simple` for images, `conv_simple` / `nature_cnn` / `convnet_impala` name
    the conv stack (`nature_cnn` is the Atari encoder of Mnih et al. (2015), 32 8x8/4, 64 4x4/2,
    64 3x3/1, then FC `hidden`, for 84x84 frame stacks; `convnet_impala` IMPALA's shallow one,
    16 8x8/4, 32 4x4/2), `resnet_impala` is Sample Factory's IMPALA ResNet (16, 32, 32
    channels, two residual blocks per stage), `mlp` takes vectors only."""

    hidden: int = 512
    """Width of the fully-connected layer after the conv stack (the encoder's output size)."""

    core: str = "gru"
    """Recurrent core: `gru`, `lstm`, `none`, or an import path `package.module:Class` to one
    of your own (docs/MODELS.md). The paper benchmarks with LSTM and trains its final VizDoom
    agents with GRU ("similar sample efficiency, slightly less computation"); `none` feeds the
    encoder straight to the heads."""

    core_size: int = 512
    """Hidden size of the GRU/LSTM (an LSTM's flat state is `2 * core_size`: h then c)."""

    rnn_num_layers: int = 1
    """Stacked GRU / LSTM layers (Sample Factory's `rnn_num_layers`); the flat state grows to
    `rnn_num_layers * core_size` (twice that for an LSTM: every layer's h, then every c)."""

    decoder_mlp_layers: tuple[int, ...] = ()
    """Layer widths of an MLP between the core and the heads (Sample Factory's
    `decoder_mlp_layers`); empty: the heads read the core's output directly."""

    actor_critic_share_weights: bool = True
    """false: the actor and the critic each get their own encoder, core and decoder (Sample
    Factory's `ActorCriticSeparateWeights`); the flat RNN state then holds the actor's state
    followed by the critic's, twice the core's width."""

    policy_initialization: Literal["orthogonal", "xavier_uniform", "torch_default"] = \
        "orthogonal"
    """Initial weights of the built-in encoders, cores and decoder (Sample Factory's
    `policy_initialization`): `orthogonal` (gain sqrt(2) for the conv / MLP layers, 1 for the
    RNN), `xavier_uniform` (same gains), `torch_default` (PyTorch's own init, biases too).
    The heads are orthogonal with gain 1 under the first two."""

    policy_init_gain: float | None = None
    """Sample Factory's `policy_init_gain`: a number gives every conv and linear layer, the
    categorical heads and the critic included, that gain under `orthogonal` or `xavier_uniform`,
    and leaves the recurrent core at PyTorch's initialization, as Sample Factory does (its
    default: 1.0); unset: the gains above. A Gaussian head keeps its own initialization."""

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

    normalize_input_keys: tuple[str, ...] = ()
    """The observation keys `normalize_input` keeps running statistics of (Sample Factory's
    `normalize_input_keys`); empty: every key. The others reach the model as they are (uint8
    images divided by 255)."""

    obs_subtract_mean: float = 0.0
    """Subtracted from the raw `obs` key before anything else (Sample Factory's
    `obs_subtract_mean`, e.g. 128 for 8-bit images). Only without `normalize_input`: running
    normalization removes any constant shift itself."""

    obs_scale: float = 1.0
    """The raw `obs` key is divided by it (after `obs_subtract_mean`; Sample Factory's
    `obs_scale`, e.g. 255 or 128 for 8-bit images). For a uint8 image it replaces the built-in
    1 / 255; with `normalize_input` the running statistics are kept of the scaled values."""

    precision: Precision = "auto"
    """Arithmetic of the observation encoder (the conv stack is most of the model's compute):
    `bfloat16` runs it under autocast (parameters and the optimizer stay float32), `float32`
    does not, `auto` picks bfloat16 for the conv encoder on CPUs with AMX / AVX-512 BF16 and
    on CUDA devices that support it (float32 for vector observations). The built-in GRU's
    matrix products follow it on a CPU, in the learner and in the packed inference step alike
    (its gates and state stay float32); the heads always run in float32, so the
    log-probabilities in the PPO ratio keep full precision."""

    inference_weights: Literal["auto", "float32", "bfloat16"] = "auto"
    """How the CPU inference step on packed weights (docs/MODELS.md, fast paths) holds the FC
    layer and the GRU's matrix products where they compute in float32 (a CPU without fast
    bfloat16, or `precision: float32`): `bfloat16` rounds those weights to bfloat16, the
    arithmetic staying float32, so that a pass of a few rows (self-play's one or two) reads half
    the bytes; `float32` keeps the learner's weights; `auto` takes `bfloat16` where sfbus's C
    kernels are built. The behaviour policy is then the learner's with those weights rounded:
    its recorded log-probabilities are the ones it acted with, which V-trace's importance
    weights correct for as for policy lag."""

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
    sample and its log-probability either way (see sfbus_components/envs/action_bounds.py)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial_stddev) and self.initial_stddev > 0):
            raise ValueError(f"initial_stddev must be > 0 and finite, got {self.initial_stddev}")
        if not (math.isfinite(self.continuous_tanh_scale) and self.continuous_tanh_scale >= 0):
            raise ValueError("continuous_tanh_scale must be >= 0 and finite (0: off), got "
                             f"{self.continuous_tanh_scale}")
        # Imported here: the registry imports the user's module, and the built-in parts import
        # this module.
        from sfbus_components.models import registry

        for part in ("encoder", "core"):
            registry.resolve(part, getattr(self, part))  # type: ignore[arg-type]
        if self.architecture != "auto" and not registry.is_builtin("encoder", self.encoder):
            raise ValueError(f"architecture '{self.architecture}' chooses the keys of the "
                             f"built-in encoders; encoder '{self.encoder}' reads the keys it "
                             "wants: leave architecture at auto")
        if self.policy_init_gain is not None:
            if not (math.isfinite(self.policy_init_gain) and self.policy_init_gain > 0):
                raise ValueError(f"policy_init_gain must be > 0 and finite, got "
                                 f"{self.policy_init_gain}")
            if self.policy_initialization == "torch_default":
                raise ValueError("policy_init_gain scales the orthogonal or xavier_uniform "
                                 "initialization; torch_default has no gain to set (unset it: "
                                 "policy_init_gain: null)")
        if not (math.isfinite(self.obs_scale) and self.obs_scale > 0):
            raise ValueError(f"obs_scale must be > 0 and finite, got {self.obs_scale}")
        if not math.isfinite(self.obs_subtract_mean):
            raise ValueError(f"obs_subtract_mean must be finite, got {self.obs_subtract_mean}")
        if self.obs_subtract_mean != 0 and self.normalize_input:
            raise ValueError("obs_subtract_mean has no effect with normalize_input (the running "
                             "mean removes any constant shift): set normalize_input: false")
        for name in ("hidden", "core_size", "rnn_num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("mlp_layers", "measurements_hidden", "decoder_mlp_layers"):
            if any(width < 1 for width in getattr(self, name)):
                raise ValueError(f"{name}: every layer width must be >= 1, got "
                                 f"{list(getattr(self, name))}")
