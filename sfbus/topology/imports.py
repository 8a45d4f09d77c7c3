"""Objects named by an import path ``package.module:name`` (actor classes, model parts, env
factories, policy mappings), imported with an error that says what is missing and what is close.

A path that no longer imports because what it names moved is followed to where it went: packages
register their moves under the ``sfbus.moved`` entry-point group, each entry naming a mapping
from an old name to its new one. An old name is one object (``pkg.mod:Class``), one module
(``pkg.mod``) or, ending with a dot, a package and everything under it (``pkg.``). The most
precise name that covers a path wins, in that order (a module can become a package of the same
name), and a move may lead to another (a module renamed twice). So a run directory or topology
written before a rename still loads.
"""

from __future__ import annotations

import functools
import importlib
import logging
import pkgutil
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from sfbus.topology.params import suggest

log = logging.getLogger(__name__)

MOVED_GROUP = "sfbus.moved"
"""The entry-point group where packages register the import paths they moved."""


class ImportPathError(ValueError):
    """An import path that names nothing importable; the message says why (unlocated: the caller
    adds which setting gave the path)."""


def import_object(path: str) -> Any:
    """The object ``package.module:name`` (or ``:Outer.inner``) names, or where it moved."""
    seen = [path]
    while True:
        try:
            return _import_exactly(seen[-1])
        except ImportPathError as error:
            moved = moved_to(seen[-1], registered_moves())
            if moved is None or moved in seen:
                if len(seen) == 1:
                    raise
                raise ImportPathError(f"'{path}' moved to '{seen[-1]}': {error}") from None
        log.debug("import path %r moved to %r", seen[-1], moved)
        seen.append(moved)


def moved_to(path: str, moves: Mapping[str, str]) -> str | None:
    """Where ``path`` moved by ``moves`` (old name -> new, see the module's docstring), or None.

    The path itself first, then its module, then the longest package (``pkg.`` -> ``new.``
    takes ``pkg.sub:X`` to ``new.sub:X``).
    """
    if path in moves:
        return moves[path]
    module, sep, attr = path.partition(":")
    if module in moves:
        return moves[module] + sep + attr
    parts = module.split(".")
    for end in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:end]) + "."
        if package in moves:
            return moves[package] + module[len(package):] + sep + attr
    return None


@functools.cache
def registered_moves() -> dict[str, str]:
    """Every move the installed packages registered (``sfbus.moved`` entry points)."""
    moves: dict[str, str] = {}
    for entry in entry_points(group=MOVED_GROUP):
        moves.update(entry.load())
    return moves


def _import_exactly(path: str) -> Any:
    """The object ``path`` names where it is now (no moves followed)."""
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
