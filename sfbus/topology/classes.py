"""Actor classes named in a topology (``module:Class``), imported and checked."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

from sfbus.errors import TopologyError
from sfbus.topology.params import suggest


def import_actor_class(class_path: str) -> type:
    """Import ``"module:Class"`` and check it is an ``Actor``; raises an unlocated TopologyError."""
    module_name, sep, attr = class_path.partition(":")
    if not sep or not module_name or not attr:
        raise TopologyError(f"expected 'module:Class', got '{class_path}'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise TopologyError(f"cannot import module '{module_name}': no module named "
                                f"'{missing}'{_module_hint(missing)}") from None
        raise TopologyError(f"importing module '{module_name}' failed: {error}") from None
    except Exception as error:  # any import-time failure of the user's module is their bug
        raise TopologyError(f"importing module '{module_name}' failed: "
                            f"{type(error).__name__}: {error}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise TopologyError(f"module '{module_name}' has no attribute '{attr}'"
                                f"{suggest(part, names)}")
        obj = getattr(obj, part)
    # Looked up, not imported: a subclass of Actor has imported sfbus.actor already, and not
    # importing it keeps the topology below the actor in the kernel's layers (sfbus.actor's
    # context reaches the topology through the routing table; an import back would close a circle).
    base = getattr(sys.modules.get("sfbus.actor"), "Actor", None)
    if not (isinstance(obj, type) and base is not None and issubclass(obj, base)):
        raise TopologyError(f"'{class_path}' is not a subclass of sfbus.actor.Actor")
    return obj


def _module_hint(missing: str) -> str:
    parent, _, leaf = missing.rpartition(".")
    if not parent:
        return ""
    try:
        package = importlib.import_module(parent)
    except Exception:  # the hint is best-effort; the error is already known
        return ""
    return suggest(leaf, [m.name for m in pkgutil.iter_modules(getattr(package, "__path__", []))])
