"""Observation encoders: the paper's conv stack, the Nature CNN, the IMPALA ResNet and a vector
MLP as branches of the built-in multi-input encoder, and the runner that gives a user's encoder
the same precision and input handling (the protocol is in docs/MODELS.md)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor, nn

from sfbus_components.envs.spec import ACTION_MASK_KEY
from sfbus_components.models.config import ModelConfig
from sfbus_components.models.elu import ELU
from sfbus_components.models.precision import uses_bf16

CONV_STACKS: dict[str, tuple[tuple[int, int, int], ...]] = {
    # Sample Factory's `convnet_simple`, the "3-layer convolutional head followed by a
    # fully-connected layer" of supplement A.1.3
    "conv_simple": ((32, 8, 4), (64, 4, 2), (128, 3, 2)),
    # The DQN paper's encoder (Mnih et al. 2015, "Human-level control"), Sample Factory's
    # `convnet_atari`: on 84x84 inputs it leaves 64 maps of 7x7 for the FC layer
    "nature_cnn": ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
    # IMPALA's shallow network (Espeholt et al. 2018, Figure 3 left), Sample Factory's
    # `convnet_impala`
    "convnet_impala": ((16, 8, 4), (32, 4, 2)),
}
"""(out_channels, kernel, stride) of each layer of the named conv stacks."""
# (channels, residual blocks) per stage of Sample Factory's `resnet_impala`, the IMPALA paper's
# "deep" network (Espeholt et al. 2018, Figure 3): 16, 32, 32 channels, two blocks each.
RESNET_IMPALA_STAGES: tuple[tuple[int, int], ...] = ((16, 2), (32, 2), (32, 2))


def activation(name: str) -> nn.Module:
    """The nonlinearity module called `name`."""
    return {"elu": ELU, "relu": nn.ReLU, "tanh": nn.Tanh}[name]()


def mlp(in_size: int, widths: tuple[int, ...], nonlinearity: str) -> nn.Sequential:
    """Linear + activation per width; an empty `widths` gives the identity."""
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(in_size, width), activation(nonlinearity)]
        in_size = width
    return nn.Sequential(*layers)


class ChannelsFirst(nn.Module):
    """``inner`` on an NCHW copy of its input: a conv stack's last nonlinearity, whose output
    the FC layer reads flattened in NCHW order anyway (the copy only moves before it). Its
    gradient then comes back in the layout of its saved input; with a channels-last input and
    an NCHW gradient, torch's ELU backward took 16 ms instead of ~1 on the learner's batch."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        """``inner(x)`` computed on ``x.contiguous()``."""
        return self.inner(x.contiguous())


def conv_stack(channels: int, filters: tuple[tuple[int, int, int], ...],
               nonlinearity: str) -> nn.Sequential:
    """Conv layers of `filters` (out_channels, kernel, stride), each followed by the
    nonlinearity (the last one in NCHW, :class:`ChannelsFirst`)."""
    layers: list[nn.Module] = []
    for out_channels, kernel, stride in filters:
        layers += [nn.Conv2d(channels, out_channels, kernel, stride), activation(nonlinearity)]
        channels = out_channels
    layers[-1] = ChannelsFirst(layers[-1])
    return nn.Sequential(*layers)


class ConvEncoder(nn.Module):
    """A conv stack (``conv``), then one FC layer to `hidden` followed by the configured
    nonlinearity."""

    def __init__(self, obs_shape: tuple[int, ...], cfg: ModelConfig, conv: nn.Module,
                 layout: str) -> None:
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.conv = conv
        with torch.no_grad():
            try:
                conv_out = self.conv(torch.zeros(1, *obs_shape)).numel()
            except RuntimeError:  # torch's words: "Kernel size can't be greater than ..."
                raise ValueError(f"images of shape {list(obs_shape)} are too small for the conv "
                                 f"stack {layout}") from None
        self.fc = nn.Sequential(nn.Linear(conv_out, cfg.hidden), activation(cfg.nonlinearity))
        self.out_size = cfg.hidden

    def forward(self, x: Tensor) -> Tensor:
        """Encode float images `[N, C, H, W]` (already scaled to [0, 1]) into `[N, hidden]`."""
        # oneDNN's convolutions are faster on channels-last input (1.2x in float32, 1.7x in
        # bfloat16 for the learner's batch on this CPU); one copy into that layout and into
        # autocast's dtype, where autocast would cast the float32 copy again (~50 ms of a
        # learner step). Flatten below is a reshape, so the layout is invisible outside.
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        x = x.to(dtype, memory_format=torch.channels_last)
        return self.fc(torch.flatten(self.conv(x), 1))


class StackEncoder(ConvEncoder):
    """The conv stack ``CONV_STACKS[stack]``, then one FC layer to `hidden` (``conv_simple`` is
    the paper's and the only one the packed CPU inference path runs)."""

    def __init__(self, obs_shape: tuple[int, ...], cfg: ModelConfig, stack: str) -> None:
        filters = CONV_STACKS[stack]
        super().__init__(obs_shape, cfg, conv_stack(obs_shape[0], filters, cfg.nonlinearity),
                         f"{stack} {[f[1:] for f in filters]} (kernel, stride)")
        self.stack = stack


class ResBlock(nn.Module):
    """``x + conv(act(conv(act(x))))``, 3x3 convs keeping the size (IMPALA's residual block)."""

    def __init__(self, channels: int, nonlinearity: str) -> None:
        super().__init__()
        self.body = nn.Sequential(
            activation(nonlinearity), nn.Conv2d(channels, channels, 3, 1, padding=1),
            activation(nonlinearity), nn.Conv2d(channels, channels, 3, 1, padding=1))

    def forward(self, x: Tensor) -> Tensor:
        """The block's output, same shape as ``x``."""
        return x + self.body(x)


class ResnetImpalaEncoder(ConvEncoder):
    """The IMPALA ResNet (Espeholt et al. 2018; Sample Factory's `resnet_impala`): per stage of
    `RESNET_IMPALA_STAGES` (channels, blocks) a 3x3/1 conv, a 3x3/2 max-pool and residual blocks;
    then the nonlinearity and one FC layer to `hidden`."""

    def __init__(self, obs_shape: tuple[int, ...], cfg: ModelConfig) -> None:
        layers: list[nn.Module] = []
        channels = obs_shape[0]
        for out_channels, blocks in RESNET_IMPALA_STAGES:
            layers += [nn.Conv2d(channels, out_channels, 3, 1, padding=1),
                       nn.MaxPool2d(3, 2, padding=1)]
            layers += [ResBlock(out_channels, cfg.nonlinearity) for _ in range(blocks)]
            channels = out_channels
        layers.append(ChannelsFirst(activation(cfg.nonlinearity)))
        super().__init__(obs_shape, cfg, nn.Sequential(*layers), "resnet_impala")


class MlpEncoder(nn.Module):
    """MLP over a (normalized) vector observation; the output size is the last layer's width."""

    def __init__(self, in_size: int, widths: tuple[int, ...], nonlinearity: str) -> None:
        super().__init__()
        self.net = mlp(in_size, widths, nonlinearity)
        self.out_size = widths[-1] if widths else in_size

    def forward(self, x: Tensor) -> Tensor:
        """Encode `[N, D]` into `[N, out_size]`."""
        return self.net(x)


def to_float(x: Tensor) -> Tensor:
    """uint8 images to float32 in [0, 1], bfloat16 unchanged (the learner's images, normalized
    into the encoder's compute dtype), anything else to float32."""
    if x.dtype == torch.uint8:
        return x.float() * (1.0 / 255.0)
    return x if x.dtype == torch.bfloat16 else x.float()


class EncoderRunner(nn.Module):
    """What the actor-critic needs of any encoder: the run's precision (bfloat16 autocast where
    chosen), float inputs (uint8 images scaled to [0, 1]) and a float32 ``[N, out_size]`` output.
    Subclasses encode the float observations in :meth:`encode`."""

    out_size: int
    """Width of the features."""
    keys: tuple[str, ...]
    """The observation keys the encoder reads, in the order exported models take them."""
    precision: str
    """``float32`` or ``bfloat16``, or ``auto`` (bfloat16 on hardware that makes it fast)."""

    def encode(self, obs: dict[str, Tensor]) -> Tensor:
        """Features ``[N, out_size]`` of float observations (the keys of :attr:`keys`)."""
        raise NotImplementedError

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the encoder computes in on ``device``: images fed in it skip a cast."""
        return torch.bfloat16 if uses_bf16(self.precision, device) else torch.float32

    def keep_weights_in_compute_dtype(self, device: torch.device) -> None:
        """Store the weights in bfloat16 when they are used in bfloat16 on ``device``: for
        inference, where autocast would otherwise cast every weight on every forward pass (the
        conv stack's 6.4M-weight FC layer makes that ~15% of a small batch's time). Not for
        training: the optimizer needs float32 weights."""
        if self.compute_dtype(device) == torch.bfloat16:
            self.to(torch.bfloat16)

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        """Encode a dict of ``[N, ...]`` tensors into float32 ``[N, out_size]``."""
        device = obs[self.keys[0]].device
        with torch.autocast(device.type, dtype=torch.bfloat16,
                            enabled=uses_bf16(self.precision, device)):
            x = self.encode({key: to_float(obs[key]) for key in self.keys})
        return x.float()


ImageEncoder = Callable[[tuple[int, ...], ModelConfig], ConvEncoder]
"""Builds the branch of one image key: ``(shape [C, H, W], cfg) -> ConvEncoder``."""


class ObsEncoder(EncoderRunner):
    """The built-in encoder: each observation key the architecture reads through its own
    branch, the features concatenated in the env's key order. An image ``[C, H, W]`` goes
    through ``images`` (None: images are refused), a vector ``[D]`` through an MLP of
    ``mlp_layers`` (in ``full``, ``measurements`` through ``measurements_hidden``), the main key
    ``obs`` only where ``vector_obs``. With the one key ``obs`` this is the paper's
    ``simplified`` model; with ``obs`` and ``measurements``, its ``full`` one. The variants the
    ``model.encoder`` names build are the constants below (``models/registry.py``)."""

    def __init__(self, obs_spec: dict[str, tuple[tuple[int, ...], str]], cfg: ModelConfig, *,
                 images: ImageEncoder | None, vector_obs: bool) -> None:
        super().__init__()
        self.keys = self._keys(obs_spec, cfg.architecture)
        branches: dict[str, nn.Module] = {}
        for key in self.keys:
            shape = tuple(obs_spec[key][0])
            if len(shape) == 3 and images is not None:
                branches[key] = images(shape, cfg)
            elif len(shape) == 1 and (vector_obs or key != "obs"):
                widths = cfg.measurements_hidden if cfg.architecture == "full" and \
                    key == "measurements" else cfg.mlp_layers
                branches[key] = MlpEncoder(shape[0], widths, cfg.nonlinearity)
            elif images is not None and vector_obs:
                raise ValueError(f"observation '{key}' of shape {list(shape)}: the built-in "
                                 "encoders take images [C, H, W] and vectors [D]; reshape it in "
                                 "the env or bring an encoder of your own (docs/MODELS.md)")
            else:
                need = "vectors [D]" if images is None else "images [C, H, W]"
                raise ValueError(f"{cfg.encoder} encoder needs {need}, but observation '{key}' "
                                 f"has shape {list(shape)}")
        self.branches = nn.ModuleDict(branches)
        self.out_size = sum(branch.out_size for branch in branches.values())
        # `auto` means bfloat16 for a conv stack only: a small MLP gains nothing from it
        has_conv = any(isinstance(b, ConvEncoder) for b in branches.values())
        self.precision = "float32" if cfg.precision == "auto" and not has_conv else cfg.precision

    @staticmethod
    def _keys(obs_spec: dict[str, tuple[tuple[int, ...], str]],
              architecture: str) -> tuple[str, ...]:
        """The keys ``architecture`` reads: every key but ``action_mask`` (``auto``), ``obs``
        (``simplified``) or ``obs`` and ``measurements`` (``full``)."""
        if architecture == "auto":
            if any("." in key for key in obs_spec):  # a module name cannot hold a dot
                raise ValueError(f"observation keys {sorted(obs_spec)}: the built-in encoder "
                                 "needs keys without '.'")
            # the action mask shapes the action distribution, it is not an input
            return tuple(key for key in obs_spec if key != ACTION_MASK_KEY)
        wanted = ("obs",) if architecture == "simplified" else ("obs", "measurements")
        missing = [key for key in wanted if key not in obs_spec]
        if missing:
            raise ValueError(f"architecture '{architecture}' needs the observation keys "
                             f"{list(wanted)}, but the env has {sorted(obs_spec)}")
        return wanted

    @property
    def main(self) -> nn.Module:
        """The branch of the main observation ``obs`` (the only one in ``simplified``)."""
        return self.branches["obs"]

    def encode(self, obs: dict[str, Tensor]) -> Tensor:
        """The branches' features, concatenated in key order."""
        features = [branch(obs[key]) for key, branch in self.branches.items()]
        return features[0] if len(features) == 1 else torch.cat(features, dim=1)


def _stack(name: str) -> ImageEncoder:
    return functools.partial(StackEncoder, stack=name)


# The built-in encoders by what they do with images and with a vector `obs`; models/registry.py
# names them (``model.encoder``).
AUTO_ENCODER = functools.partial(ObsEncoder, images=_stack("conv_simple"), vector_obs=True)
"""Images through ``conv_simple``, vectors through an MLP: whatever the env observes."""
CONV_SIMPLE_ENCODER = functools.partial(ObsEncoder, images=_stack("conv_simple"),
                                        vector_obs=False)
NATURE_CNN_ENCODER = functools.partial(ObsEncoder, images=_stack("nature_cnn"), vector_obs=False)
CONVNET_IMPALA_ENCODER = functools.partial(ObsEncoder, images=_stack("convnet_impala"),
                                           vector_obs=False)
RESNET_IMPALA_ENCODER = functools.partial(ObsEncoder, images=ResnetImpalaEncoder,
                                          vector_obs=False)
MLP_ENCODER = functools.partial(ObsEncoder, images=None, vector_obs=True)
"""Vectors only: an image observation is refused."""


class UserEncoder(EncoderRunner):
    """An encoder of the user's (``main``), run like the built-in one: it reads every
    observation key; ``auto`` precision means float32 for it (bfloat16 only when asked)."""

    def __init__(self, main: nn.Module, keys: tuple[str, ...], cfg: ModelConfig) -> None:
        super().__init__()
        self.main = main
        self.keys = keys
        self.out_size = main.out_size
        self.precision = "float32" if cfg.precision == "auto" else cfg.precision

    def encode(self, obs: dict[str, Tensor]) -> Tensor:
        """The user's encoder on the whole observation dict."""
        return self.main(obs)
