"""Observation encoders: the paper's conv stack, the Nature CNN, a vector MLP and the
measurements MLP."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from components.models.config import ModelConfig
from components.models.precision import uses_bf16

# (out_channels, kernel, stride) of Sample Factory's `convnet_simple`, the "3-layer convolutional
# head followed by a fully-connected layer" of supplement A.1.3.
CONV_SIMPLE_FILTERS: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (128, 3, 2))
# The DQN paper's encoder (Mnih et al. 2015, "Human-level control"), Sample Factory's
# `convnet_atari`: on 84x84 inputs it leaves 64 maps of 7x7 for the FC layer.
NATURE_CNN_FILTERS: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def activation(name: str) -> nn.Module:
    """The nonlinearity module called `name`."""
    return {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}[name]()


def mlp(in_size: int, widths: tuple[int, ...], nonlinearity: str) -> nn.Sequential:
    """Linear + activation per width; an empty `widths` gives the identity."""
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(in_size, width), activation(nonlinearity)]
        in_size = width
    return nn.Sequential(*layers)


class ConvEncoder(nn.Module):
    """Conv layers of `filters` (out_channels, kernel, stride), then one FC layer to `hidden`,
    each followed by the configured nonlinearity."""

    def __init__(self, obs_shape: tuple[int, ...], cfg: ModelConfig,
                 filters: tuple[tuple[int, int, int], ...]) -> None:
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        layers: list[nn.Module] = []
        channels = obs_shape[0]
        for out_channels, kernel, stride in filters:
            layers += [
                nn.Conv2d(channels, out_channels, kernel, stride),
                activation(cfg.nonlinearity),
            ]
            channels = out_channels
        self.conv = nn.Sequential(*layers)
        with torch.no_grad():
            conv_out = self.conv(torch.zeros(1, *obs_shape)).numel()
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


class ConvSimpleEncoder(ConvEncoder):
    """3 conv layers (32 8x8/4, 64 4x4/2, 128 3x3/2) then one FC layer to `hidden` (the paper's;
    the only encoder the packed CPU inference path runs)."""

    def __init__(self, obs_shape: tuple[int, ...], cfg: ModelConfig) -> None:
        super().__init__(obs_shape, cfg, CONV_SIMPLE_FILTERS)


class NatureCnnEncoder(ConvEncoder):
    """The Nature CNN: 32 8x8/4, 64 4x4/2, 64 3x3/1, then one FC layer to `hidden` (512)."""

    def __init__(self, obs_shape: tuple[int, ...], cfg: ModelConfig) -> None:
        super().__init__(obs_shape, cfg, NATURE_CNN_FILTERS)


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


class ObsEncoder(nn.Module):
    """Encodes an observation dict: `obs` (image or vector) plus, in `full`, `measurements`."""

    def __init__(self, obs_spec: dict[str, tuple[tuple[int, ...], str]], cfg: ModelConfig) -> None:
        super().__init__()
        if "obs" not in obs_spec:
            raise ValueError(f"obs_spec needs an 'obs' entry, got keys {sorted(obs_spec)}")
        obs_shape = tuple(obs_spec["obs"][0])
        kind = cfg.encoder
        if kind == "auto":
            kind = "conv_simple" if len(obs_shape) == 3 else "mlp"
        self.main: nn.Module
        convs = {"conv_simple": ConvSimpleEncoder, "nature_cnn": NatureCnnEncoder}
        if kind in convs:
            if len(obs_shape) != 3:
                raise ValueError(f"{kind} needs [C, H, W] observations, got {obs_shape}")
            self.main = convs[kind](obs_shape, cfg)
        else:
            if len(obs_shape) != 1:
                raise ValueError(f"mlp encoder needs [D] observations, got {obs_shape}")
            self.main = MlpEncoder(obs_shape[0], cfg.mlp_layers, cfg.nonlinearity)
        self.out_size: int = self.main.out_size
        # `auto` means bfloat16 for a conv stack only: a small MLP gains nothing from it
        self.precision = "float32" if cfg.precision == "auto" and kind not in convs \
            else cfg.precision
        self.measurements: MlpEncoder | None = None
        if cfg.architecture == "full":
            if "measurements" not in obs_spec:
                raise ValueError("architecture 'full' needs a 'measurements' entry in obs_spec")
            (num_measurements,) = obs_spec["measurements"][0]
            self.measurements = MlpEncoder(
                num_measurements, cfg.measurements_hidden, cfg.nonlinearity
            )
            self.out_size += self.measurements.out_size

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the main encoder computes in on ``device``: images fed in it skip a cast."""
        return torch.bfloat16 if uses_bf16(self.precision, device) else torch.float32

    def keep_weights_in_compute_dtype(self, device: torch.device) -> None:
        """Store the weights in bfloat16 when they are used in bfloat16 on ``device``: for
        inference, where autocast would otherwise cast every weight on every forward pass (the
        conv stack's 6.4M-weight FC layer makes that ~15% of a small batch's time). Not for
        training: the optimizer needs float32 weights."""
        if self.compute_dtype(device) == torch.bfloat16:
            self.to(torch.bfloat16)

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        """Encode a dict of `[N, ...]` tensors into float32 `[N, out_size]`."""
        image = obs["obs"]
        with torch.autocast(image.device.type, dtype=torch.bfloat16,
                            enabled=uses_bf16(self.precision, image.device)):
            x = self.main(to_float(image))
            if self.measurements is not None:
                x = torch.cat([x, self.measurements(obs["measurements"].float())], dim=1)
        return x.float()
