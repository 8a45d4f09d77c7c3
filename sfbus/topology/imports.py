"""Objects named by an import path ``package.module:name`` (actor classes, model parts, env
factories, policy mappings), imported with an error that says what is missing and what is close."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from sfbus.topology.params import suggest


class ImportPathError(ValueError):
    """An import path that names nothing importable; the message says why (unlocated: the caller
    adds which setting gave the path)."""


def import_object(path: str) -> Any:
    """The object ``package.module:name`` (or ``:Outer.inner``) names."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ImportPathError(f"expected 'package.module:Name', got '{path}'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            hint = _module_hint(missing) or (" (not installed, nor on PYTHONPATH or in the "
                                             "working directory)" if "." not in missing else "")
            raise ImportPathError(f"cannot import module '{module_name}': no module named "
                                  f"'{missing}'{hint}") from None
        raise ImportPathError(f"importing module '{module_name}' failed: {error}") from None
    except Exception as error:  # any import-time failure of the user's module is their bug
        raise ImportPathError(f"importing module '{module_name}' failed: "
                              f"{type(error).__name__}: {error}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise ImportPathError(f"module '{module_name}' has no attribute '{attr}'"
                                  f"{suggest(part, names)}")
        obj = getattr(obj, part)
    return obj


def _module_hint(missing: str) -> str:
    """A "did you mean" among the modules beside a missing submodule."""
    parent, _, leaf = missing.rpartition(".")
    if not parent:
        return ""
    try:
        package = importlib.import_module(parent)
    except Exception:  # the hint is best-effort; the error is already known
        return ""
    return suggest(leaf, [m.name for m in pkgutil.iter_modules(getattr(package, "__path__", []))])
