"""A Sample Factory 2.x experiment read as sfbus settings and an sfbus policy's state.

An experiment folder (``train_dir/<experiment>/``) holds ``config.json`` (every flag of the run)
and ``checkpoint_p<policy>/checkpoint_<train step>_<env steps>.pth``, a ``torch.save`` of a dict
whose ``model`` is the state dict of ``ActorCriticSharedWeights`` (the default; separate weights
are not read here). :func:`read_experiment` reads both; :func:`model_settings` gives the
``model`` settings of the equivalent sfbus network and :func:`convert_state` the policy's state
dict and the returns normalizer's.

Sample Factory's key -> sfbus's (:data:`_RENAMES`): the encoder's branches (``encoder.encoders.
<key>``, or the VizDoom encoder's ``basic_encoder`` and ``measurements_head``) become
``model.encoder.branches.<key>``, the conv stack ``enc.conv_head`` -> ``conv``, its FC layer
``enc.mlp_layers`` -> ``fc``, an MLP ``mlp_head`` -> ``net``, the GRU / LSTM ``core.core`` ->
``model.core.rnn``, ``decoder.mlp`` -> ``model.decoder``, ``critic_linear`` -> ``model.critic``,
``action_parameterization.distribution_linear`` -> ``model.actor``. The converted dict must name
every tensor of the sfbus policy with its shape, or the import is refused: a model whose layout
differs is never half loaded.

The normalizers' statistics are copied with one change: Sample Factory adds 1e-5 to every
variance under the square root, sfbus 1e-8 to a vector's and to the returns' (1e-5 to an image
pixel's, as there), so the difference is added to those stored variances; the normalized values
are then Sample Factory's to float rounding.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sfbus import BadInput
from sfbus_components.models.normalizers import ReturnsNormalizer, RunningMeanStd

SF_EPS = 1e-5
"""Sample Factory's ``_NORM_EPS``: added to every running variance before the square root."""
_CHECKPOINT = re.compile(r"^checkpoint_(\d+)_(\d+)\.pth$")
_CONV = {"convnet_simple": "conv_simple", "convnet_atari": "nature_cnn",
         "convnet_impala": "convnet_impala", "resnet_impala": "resnet_impala"}
"""Sample Factory's ``encoder_conv_architecture`` -> sfbus's ``model.encoder``."""
_RENAMES: tuple[tuple[str, str], ...] = (
    (r"^encoder\.basic_encoder\.", "model.encoder.branches.obs."),
    (r"^encoder\.measurements_head\.", "model.encoder.branches.measurements.net."),
    (r"^encoder\.encoders\.", "model.encoder.branches."),
    (r"\.enc\.conv_head\.|\.conv_head\.", ".conv."),
    (r"\.enc\.mlp_layers\.|\.mlp_layers\.", ".fc."),
    (r"\.res_block_core\.", ".body."),
    (r"\.mlp_head\.", ".net."),
    (r"^core\.core\.", "model.core.rnn."),
    (r"^decoder\.mlp\.", "model.decoder."),
    (r"^critic_linear\.", "model.critic."),
    (r"^action_parameterization\.distribution_linear\.", "model.actor."),
    (r"^obs_normalizer\.running_mean_std\.running_mean_std\.(\w+)\.running_(mean|var)$",
     r"obs_normalizer.stats.\1.\2"),
    (r"^obs_normalizer\.running_mean_std\.running_mean_std\.(\w+)\.count$",
     r"obs_normalizer.stats.\1.count"),
)


@dataclass(frozen=True)
class Experiment:
    """A Sample Factory experiment: its configuration and its newest checkpoint of a policy."""

    folder: Path
    config: dict[str, Any]
    """``config.json``: Sample Factory's flags by name."""
    checkpoint: Path
    state: dict[str, Any]
    """The checkpoint's dict (``model``, ``train_step``, ``env_steps``, ...)."""


def read_experiment(folder: Path, policy: int = 0) -> Experiment:
    """``folder``'s ``config.json`` and newest ``checkpoint_p<policy>/checkpoint_*.pth``
    (read with ``weights_only``: a checkpoint cannot run code); bad input where either is
    missing or unreadable."""
    config_path = folder / "config.json"
    if not folder.is_dir():
        raise BadInput(f"{folder}: no such directory")
    if not config_path.is_file():
        raise BadInput(f"{folder}: not a Sample Factory experiment (no config.json)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise BadInput(f"{config_path}: unreadable: {error}") from None
    if not isinstance(config, dict) or "env" not in config:
        raise BadInput(f"{config_path}: not a Sample Factory configuration (no env)")
    found = sorted((int(m.group(1)), p) for p in (folder / f"checkpoint_p{policy}").glob("*.pth")
                   if (m := _CHECKPOINT.match(p.name)))
    if not found:
        raise BadInput(f"{folder / f'checkpoint_p{policy}'}: no checkpoint_<step>_<frames>.pth "
                       f"of policy {policy}")
    path = found[-1][1]
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch's unpickler raises many kinds for a foreign file
        raise BadInput(f"{path}: not a readable checkpoint ({type(error).__name__})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise BadInput(f"{path}: not a Sample Factory checkpoint (no model state)")
    return Experiment(folder, config, path, state)


def model_settings(config: dict[str, Any], image: bool, measurements: bool) -> dict[str, Any]:
    """sfbus's ``model`` settings for Sample Factory's ``config`` (the env has an ``image``
    observation, and VizDoom ``measurements`` beside it); bad input for what sfbus cannot
    build the same."""
    where = "config.json"
    if not config.get("actor_critic_share_weights", True):
        raise BadInput(f"{where}: actor_critic_share_weights false is not imported (only "
                       "Sample Factory's default, shared weights)")
    model: dict[str, Any] = {
        "nonlinearity": config.get("nonlinearity", "elu"),
        "decoder_mlp_layers": list(config.get("decoder_mlp_layers") or []),
        "mlp_layers": list(config.get("encoder_mlp_layers") or [512, 512]),
        "normalize_input": bool(config.get("normalize_input", True)),
        "normalize_input_keys": list(config.get("normalize_input_keys") or []),
        "obs_subtract_mean": float(config.get("obs_subtract_mean", 0.0)),
        "obs_scale": float(config.get("obs_scale", 1.0)),
        "policy_initialization": config.get("policy_initialization", "orthogonal"),
        "policy_init_gain": float(config.get("policy_init_gain", 1.0)),
        # the policy computes as Sample Factory's: no bfloat16 encoder
        "precision": "float32",
    }
    if config.get("use_rnn", True):
        rnn = config.get("rnn_type", "gru")
        layers = int(config.get("rnn_num_layers", 1))
        if rnn not in ("gru", "lstm") or (rnn == "lstm" and layers > 1):
            raise BadInput(f"{where}: rnn_type {rnn} with {layers} layers is not imported (a GRU "
                           "of any depth or a one-layer LSTM)")
        model.update(core=rnn, core_size=int(config.get("rnn_size", 512)), rnn_num_layers=layers)
    else:
        model["core"] = "none"
    if image:
        architecture = config.get("encoder_conv_architecture", "convnet_simple")
        conv_mlp = list(config.get("encoder_conv_mlp_layers") or [])
        if architecture not in _CONV or len(conv_mlp) != 1:
            raise BadInput(f"{where}: encoder_conv_architecture {architecture} with "
                           f"encoder_conv_mlp_layers {conv_mlp} is not imported (one of "
                           f"{', '.join(_CONV)}, and one FC layer)")
        if model["obs_scale"] != 255.0:
            raise BadInput(f"{where}: obs_scale {model['obs_scale']:g} on images is not imported "
                           "(sfbus reads 8-bit images in [0, 1] units: obs_scale 255)")
        model.update(encoder=_CONV[architecture], hidden=conv_mlp[0])
        if measurements:  # Sample Factory's VizDoom encoder: two layers of 128
            model.update(architecture="full", measurements_hidden=[128, 128])
    return model


def convert_state(sf_model: dict[str, Tensor], target: dict[str, Tensor],
                  image_keys: set[str], where: Path) -> tuple[dict[str, Tensor], dict | None]:
    """Sample Factory's model state dict as the sfbus policy's (``target``: a fresh policy's
    state dict, giving every key and shape), and the returns normalizer's state (None without
    one). ``image_keys``: the observation keys whose statistics are per pixel (their epsilon is
    already Sample Factory's)."""
    converted: dict[str, Tensor] = {}
    returns: dict[str, Tensor] = {}
    for key, value in sf_model.items():
        if key.startswith("returns_normalizer."):
            returns[key.removeprefix("returns_normalizer.").removeprefix("running_")] = value
            continue
        new = key
        for pattern, replacement in _RENAMES:
            new = re.sub(pattern, replacement, new)
        converted[new] = value
    for key, value in list(converted.items()):
        if key.startswith("obs_normalizer.stats."):
            name, field = key.split(".")[2], key.split(".")[3]
            if field == "count":
                value = value.reshape(())
            elif field == "var" and name not in image_keys:
                value = value + (SF_EPS - RunningMeanStd().eps)  # a vector's epsilon
            converted[key] = value.to(target[key].dtype) if key in target else value
    missing = sorted(target.keys() - converted.keys())
    unknown = sorted(converted.keys() - target.keys())
    wrong = sorted(k for k in target.keys() & converted.keys()
                   if tuple(target[k].shape) != tuple(converted[k].shape))
    if missing or unknown or wrong:
        shapes = [f"{k} {list(converted[k].shape)} for {list(target[k].shape)}" for k in wrong]
        raise BadInput(f"{where}: the model does not match the sfbus model its config.json "
                       f"describes (missing {missing[:3]}, unknown {unknown[:3]}, shapes "
                       f"{shapes[:3]})")
    return converted, _returns_state(returns)


def _returns_state(stats: dict[str, Tensor]) -> dict[str, Tensor] | None:
    """Sample Factory's returns statistics (``[1]`` tensors) as a ``ReturnsNormalizer``'s."""
    if not stats:
        return None
    eps = ReturnsNormalizer().eps
    return {"mean": stats["mean"].reshape(()).double(),
            "var": stats["var"].reshape(()).double() + (SF_EPS - eps),
            "count": stats["count"].reshape(()).double()}
