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
import importlib
from typing import Any, Literal

Part = Literal["encoder", "core"]

ENCODERS: dict[str, str] = {
    # One class: it encodes every observation key the architecture reads, choosing each key's
    # branch (this conv stack for images, an MLP for vectors) from the name.
    "auto": "components.models.encoders:ObsEncoder",
    "conv_simple": "components.models.encoders:ObsEncoder",
    "nature_cnn": "components.models.encoders:ObsEncoder",
    "mlp": "components.models.encoders:ObsEncoder",
}
"""Built-in encoder names and the class each one builds."""

CORES: dict[str, str] = {
    "gru": "components.models.core:GruCore",
    "lstm": "components.models.core:LstmCore",
    "none": "components.models.core:IdentityCore",
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
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"{part} '{name}' is not a built-in {part} ({', '.join(table)}) nor an "
                         f"import path 'package.module:Class'{hint}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            raise ValueError(f"{part} '{name}': no module named '{error.name}' (is it installed, "
                             "on PYTHONPATH, or in the run's working directory?)") from None
        raise ValueError(f"{part} '{name}': importing '{module_name}' failed: {error}") from None
    except Exception as error:  # any import-time failure of the user's module is theirs
        raise ValueError(f"{part} '{name}': importing '{module_name}' failed: "
                         f"{type(error).__name__}: {error}") from None
    obj: Any = module
    for piece in attr.split("."):
        if not hasattr(obj, piece):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(piece, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"{part} '{name}': module '{module_name}' has no attribute "
                             f"'{attr}'{hint}")
        obj = getattr(obj, piece)
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
