"""Builds the encoder and the core a model config names, checking a user's part against the
protocol (docs/MODELS.md) on a probe batch, so that a broken part is a clear ``ValueError`` when
the run is launched (the data path builds one policy then) instead of a crash in a worker."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from sfbus_components.models import registry
from sfbus_components.models.config import ModelConfig
from sfbus_components.models.encoders import EncoderRunner, UserEncoder

_PROBE_ROWS, _PROBE_STEPS = 2, 3


def build_encoder(obs_spec: dict[str, tuple[tuple[int, ...], str]],
                  cfg: ModelConfig) -> EncoderRunner:
    """The encoder ``cfg.encoder`` names for observations of ``obs_spec``."""
    cls = registry.resolve("encoder", cfg.encoder)
    if registry.is_builtin("encoder", cfg.encoder):
        return cls(obs_spec, cfg)
    where = f"model.encoder '{cfg.encoder}'"
    module = _construct(cls, where, obs_spec, cfg)
    out_size = _out_size(module, where)
    probe = {key: torch.zeros(_PROBE_ROWS, *shape) for key, (shape, _) in obs_spec.items()}
    features = _call(module, where, "forward(obs)", probe)
    _expect_shape(features, (_PROBE_ROWS, out_size), where, "forward(obs)")
    return UserEncoder(module, tuple(obs_spec), cfg)


def build_core(in_size: int, cfg: ModelConfig) -> nn.Module:
    """The core ``cfg.core`` names over features of width ``in_size``."""
    cls = registry.resolve("core", cfg.core)
    if registry.is_builtin("core", cfg.core):
        return cls(in_size, cfg)
    where = f"model.core '{cfg.core}'"
    module = _construct(cls, where, in_size, cfg)
    out_size = _out_size(module, where)
    state_size = registry.core_state_size(cfg)
    x = torch.zeros(_PROBE_ROWS, in_size)
    state = torch.zeros(_PROBE_ROWS, state_size)
    result = _call(module.step, where, "step(x, state)", x, state)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ValueError(f"{where}: step(x, state) must return (out, new_state), got "
                         f"{type(result).__name__}")
    _expect_shape(result[0], (_PROBE_ROWS, out_size), where, "step(x, state)'s out")
    _expect_shape(result[1], (_PROBE_ROWS, state_size), where, "step(x, state)'s new_state")
    sequence = torch.zeros(_PROBE_ROWS, _PROBE_STEPS, in_size)
    dones = torch.zeros(_PROBE_ROWS, _PROBE_STEPS)
    out = _call(module.sequence, where, "sequence(x, state, dones)", sequence, state, dones)
    _expect_shape(out, (_PROBE_ROWS, _PROBE_STEPS, out_size), where, "sequence(x, state, dones)")
    return module


def _construct(cls: Any, where: str, *args: Any) -> nn.Module:
    """``cls(*args)``: a raise or anything but an ``nn.Module`` is the part's fault."""
    try:
        module = cls(*args)
    except Exception as error:
        raise ValueError(f"{where}: building it failed: {type(error).__name__}: {error}"
                         ) from None
    if not isinstance(module, nn.Module):
        raise ValueError(f"{where}: building it gave a {type(module).__name__}, not a "
                         "torch.nn.Module")
    return module


def _out_size(module: nn.Module, where: str) -> int:
    """The part's ``out_size`` attribute, which must be an int >= 1."""
    size = getattr(module, "out_size", None)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"{where}: needs an attribute out_size, an int >= 1 (the width of its "
                         f"output), got {size!r}")
    return size


def _call(fn: Any, where: str, what: str, *args: Any) -> Any:
    """``fn(*args)`` without gradients, in eval mode (a probe must not move BatchNorm's
    statistics), the part's exception reported as its fault."""
    owner = getattr(fn, "__self__", fn)
    training = owner.training
    owner.eval()
    try:
        with torch.no_grad():
            return fn(*args)
    except Exception as error:
        raise ValueError(f"{where}: {what} failed on a probe batch: "
                         f"{type(error).__name__}: {error}") from None
    finally:
        owner.train(training)


def _expect_shape(value: Any, shape: tuple[int, ...], where: str, what: str) -> None:
    """``value`` must be a floating tensor of ``shape``."""
    if not isinstance(value, Tensor) or not value.is_floating_point():
        raise ValueError(f"{where}: {what} must be a float tensor, got "
                         f"{getattr(value, 'dtype', type(value).__name__)}")
    if tuple(value.shape) != shape:
        raise ValueError(f"{where}: {what} has shape {list(value.shape)} on a probe batch, "
                         f"expected {list(shape)}")
