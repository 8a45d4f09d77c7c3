"""Model parts by name: the built-in encoders and cores, and a user's by import path.

A setting such as ``model.encoder`` or ``model.core`` holds a built-in name (a key of
:data:`ENCODERS` / :data:`CORES`) or an import path ``package.module:Class`` to a part of the
user's own that follows the protocol of docs/MODELS.md. Both go through :func:`resolve`, so a
user's class loads like a built-in (in every process: each one builds its params from the
topology and imports the path). A name that is neither, or a path that does not import, is a
``ValueError`` naming the setting, which the topology loader reports at its line (exit 2).
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, Literal

from sfbus import ImportPathError, import_object

Part = Literal["encoder", "core"]

ENCODERS: dict[str, str] = {
    # One class, ObsEncoder, each name with its own way of encoding images (its conv stack, or
    # none) and whether the main observation may be a vector (encoders.py).
    "auto": "sfbus_components.models.encoders:AUTO_ENCODER",
    "conv_simple": "sfbus_components.models.encoders:CONV_SIMPLE_ENCODER",
    "nature_cnn": "sfbus_components.models.encoders:NATURE_CNN_ENCODER",
    "convnet_impala": "sfbus_components.models.encoders:CONVNET_IMPALA_ENCODER",
    "mlp": "sfbus_components.models.encoders:MLP_ENCODER",
    "resnet_impala": "sfbus_components.models.encoders:RESNET_IMPALA_ENCODER",
}
"""Built-in encoder names and what builds each one."""

CORES: dict[str, str] = {
    "gru": "sfbus_components.models.core:GruCore",
    "lstm": "sfbus_components.models.core:LstmCore",
    "none": "sfbus_components.models.core:IdentityCore",
}
"""Built-in core names and the class each one builds."""

_TABLES: dict[Part, dict[str, str]] = {"encoder": ENCODERS, "core": CORES}


def is_builtin(part: Part, name: str) -> bool:
    """Whether ``name`` is a built-in ``part`` name (rather than an import path)."""
    return name in _TABLES[part]


@functools.cache
def resolve(part: Part, name: str) -> Any:
    """The class a ``part`` setting names: a ``ValueError`` starting with the setting's name
    (so the topology loader points at it) when it is neither a built-in name nor an importable
    path."""
    table = _TABLES[part]
    path = table.get(name, name)
    if ":" not in path:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"{part} '{name}' is not a built-in {part} ({', '.join(table)}) nor an "
                         f"import path 'package.module:Class'{hint}")
    try:
        obj = import_object(path)
    except ImportPathError as error:
        raise ValueError(f"{part} '{name}': {error}") from None
    if not callable(obj):
        raise ValueError(f"{part} '{name}' is a {type(obj).__name__}, not a class")
    if part == "core" and not callable(getattr(obj, "state_size_for", None)):
        raise ValueError(f"core '{name}' has no state_size_for(cfg): a core says the width of "
                         "its flat state from the model config alone (see docs/MODELS.md)")
    return obj


def core_state_size(cfg: Any) -> int:
    """Width of the flat recurrent state of the core ``cfg.core`` names (0: no state)."""
    size = resolve("core", cfg.core).state_size_for(cfg)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"core '{cfg.core}': state_size_for(cfg) must return an int >= 0, "
                         f"got {size!r}")
    return size


def model_state_size(cfg: Any) -> int:
    """Width of the flat recurrent state of the model ``cfg`` describes: its core's, twice over
    when the actor and the critic each have their own (``actor_critic_share_weights: false``)."""
    size = core_state_size(cfg)
    return size if cfg.actor_critic_share_weights else 2 * size
