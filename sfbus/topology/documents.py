"""A topology's document: the file, the files it ``extends``, and the ``--set`` overrides.

The loader's module docstring describes the format; this module only reads and merges the plain
data, keeping where every value came from.
"""

from __future__ import annotations

import os

from sfbus.errors import TopologyError
from sfbus.topology.params import describe_value
from sfbus.topology.yaml_source import Document, KeyPath, Where, load_yaml, parse_value

TOP_KEYS = ("extends", "name", "templates", "settings", "run", "processes", "connections")


def apply_override(doc: Document, text: str) -> None:
    """Apply one ``key.path=value`` override to a document (format: the loader's docstring)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise TopologyError(f"expected KEY=VALUE, got '{text}'", file="--set")
    path: KeyPath = tuple(part.strip() for part in key.split("."))
    if not all(path):
        raise TopologyError("empty key in path", file="--set", key=key)
    if path[0] not in TOP_KEYS:
        path = ("settings", *path)
    if path[0] == "extends":
        raise TopologyError("cannot be overridden; edit the file instead", file="--set",
                            key="extends")
    try:
        value = parse_value(raw)
    except TopologyError as error:
        raise TopologyError(f"invalid value '{raw}': {error.message}", file="--set",
                            key=key) from None
    if not isinstance(doc.data, dict):
        raise doc.error((), "a topology must be a mapping")
    doc.set(path, value, Where("--set"))


def load_chain(file: str, chain: tuple[tuple[str, str], ...] = ()) -> Document:
    """Load ``file`` and, recursively, the files it extends; ``chain`` is (realpath, shown)."""
    doc = load_yaml(file)
    if doc.data is None:
        raise doc.error((), "the file is empty; a topology must be a mapping")
    if not isinstance(doc.data, dict):
        raise doc.error((), f"a topology must be a mapping, got {describe_value(doc.data)}")
    if "extends" not in doc.data:
        return doc
    chain = (*chain, (os.path.realpath(file), file))
    target = doc.data.pop("extends")
    if not isinstance(target, str):
        raise doc.error(("extends",), f"expected a file path, got {describe_value(target)}")
    base_file = os.path.normpath(os.path.join(os.path.dirname(file), target))
    real = os.path.realpath(base_file)
    if any(real == seen for seen, _ in chain):
        shown = " -> ".join([*(name for _, name in chain), base_file])
        raise doc.error(("extends",), f"extends cycle: {shown}")
    if not os.path.isfile(base_file):
        raise doc.error(("extends",), f"file not found: '{base_file}'")
    base = load_chain(base_file, chain)
    base.data.pop("name", None)
    return doc.merged_over(base)
