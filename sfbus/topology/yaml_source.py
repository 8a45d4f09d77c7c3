"""YAML to plain data, remembering where every key and value came from.

PyYAML's ``safe_load`` forgets positions, so we compose the node graph ourselves, build plain
dicts/lists/scalars from it, and keep two maps from a key path (``("processes", "p", "replicas")``,
list items as ints) to a :class:`Where`: one for the value, one for the key that names it. Every
later error can then name the file, line and column, the way ``cfgv`` does.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sfbus.errors import TopologyError

KeyPath = tuple[str | int, ...]


class Where(NamedTuple):
    """A position in a source; ``line``/``column`` are 1-based, ``None`` for ``--set`` values."""

    file: str
    line: int | None = None
    column: int | None = None


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3`` as a float.

    YAML 1.1 (PyYAML) requires a dot in exponent floats, so ``lr: 1e-3`` would silently be the
    string ``'1e-3'``; every RL config writes learning rates that way, so accept the YAML 1.2 form.
    """


_FLOAT_1_2 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789"))


def format_path(path: KeyPath) -> str:
    """``("connections", 0, "from")`` -> ``"connections[0].from"``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes the strings :class:`_Loader` would read as floats (``'1e3'``), so
    that a dumped document loads back to the same values."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789"))

# A topology is a few hundred values; a few hundred bytes of nested aliases can expand to
# billions (the "billion laughs"), so building stops well before that.
MAX_FILE_BYTES = 1 << 20
"""A topology file larger than this is refused unread (shipped ones are a few kilobytes)."""
MAX_VALUES = 100_000


def parse_value(text: str) -> Any:
    """Parse one YAML scalar or flow value (a ``--set`` right-hand side) like a file would."""
    return parse_yaml(text, "--set").data


def dump_yaml(data: Any) -> str:
    """YAML text that :func:`load_yaml` reads back to ``data`` exactly."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


@dataclass
class Document:
    """Plain data of one (possibly merged) topology file plus where each key path came from."""

    file: str
    data: Any
    value_at: dict[KeyPath, Where] = field(default_factory=dict)
    key_at: dict[KeyPath, Where] = field(default_factory=dict)

    def where(self, path: KeyPath, *, at_key: bool = False) -> Where:
        """Position of the value (or key) at ``path``, else of its nearest located ancestor."""
        if at_key and path in self.key_at:
            return self.key_at[path]
        for end in range(len(path), -1, -1):
            if path[:end] in self.value_at:
                return self.value_at[path[:end]]
        return Where(self.file)

    def error(self, path: KeyPath, message: str, *, at_key: bool = False) -> TopologyError:
        """A :class:`TopologyError` located at ``path`` (its key when ``at_key``)."""
        where = self.where(path, at_key=at_key)
        return TopologyError(message, file=where.file, line=where.line, column=where.column,
                             key=format_path(path) or None)

    def get(self, path: KeyPath, default: Any = None) -> Any:
        """The value at ``path``, or ``default`` when any step is missing."""
        node = self.data
        for part in path:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return default
        return node

    def set(self, path: KeyPath, value: Any, where: Where) -> None:
        """Set ``value`` at a path of mapping keys, creating mappings on the way.

        Raises :class:`TopologyError` when a step exists but is not a mapping.
        """
        node = self.data
        for end, part in enumerate(path[:-1], start=1):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
                self.key_at[path[:end]] = self.value_at[path[:end]] = where
            elif not isinstance(child, dict):
                shown = "a list" if isinstance(child, list) else type(child).__name__
                raise TopologyError(f"cannot set a key inside {shown}, only inside a mapping",
                                    file=where.file, key=format_path(path[:end]))
            node = child
        node[path[-1]] = value
        # Positions of whatever the old value held are stale now.
        for table in (self.value_at, self.key_at):
            for stale in [p for p in table if p[: len(path)] == path]:
                del table[stale]
        _record(self, path, value, where)

    def merged_over(self, base: Document) -> Document:
        """This document deep-merged over ``base``: mappings merge, this one wins elsewhere."""
        data = deep_merge(base.data, self.data)
        merged = Document(self.file, data)
        for mine, theirs, out in ((self.value_at, base.value_at, merged.value_at),
                                  (self.key_at, base.key_at, merged.key_at)):
            for path, where in theirs.items():
                if path not in mine and _exists(data, path):
                    out[path] = where
            out.update(mine)
        return merged


def load_yaml(file: str) -> Document:
    """Read and parse one YAML file into a located :class:`Document`.

    Raises :class:`TopologyError` for a missing/unreadable file, a syntax error, more than one
    YAML document, non-string keys, duplicate keys or recursive aliases.
    """
    try:
        # Non-blocking open, then a look before reading: /dev/zero would be read forever, and
        # a FIFO blocks even the open.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise TopologyError("not a regular file", file=file)
        with open(fd, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise TopologyError(f"larger than {MAX_FILE_BYTES // 2**20} MiB; a topology is a "
                                "few kilobytes", file=file)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise TopologyError("file not found", file=file) from None
    except (OSError, UnicodeDecodeError) as error:
        raise TopologyError(f"cannot read file: {error}", file=file) from None
    return parse_yaml(text, file)


def parse_yaml(text: str, file: str) -> Document:
    """Parse YAML ``text`` (named ``file`` in errors) into a located :class:`Document`."""
    try:
        loader = _Loader(text)  # the reader rejects control characters already here
    except yaml.YAMLError as error:
        raise TopologyError(f"invalid YAML: {_first_line(error)}", file=file) from None
    try:
        node = loader.get_single_node()
        doc = Document(file, None)
        if node is not None:
            doc.data = _Walker(loader, doc).walk(node, ())
        return doc
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        # PyYAML reads "context, problem": "while parsing a flow sequence, expected ','...".
        problem = ", ".join(p for p in (error.context, error.problem) if p) or "syntax error"
        raise TopologyError(f"invalid YAML: {problem}", file=file,
                            line=mark.line + 1 if mark else None,
                            column=mark.column + 1 if mark else None) from None
    except yaml.YAMLError as error:
        raise TopologyError(f"invalid YAML: {_first_line(error)}", file=file) from None
    finally:
        loader.dispose()


def _first_line(error: Exception) -> str:
    """PyYAML's messages span lines; errors here are one line."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _where(file: str, node: Node) -> Where:
    return Where(file, node.start_mark.line + 1, node.start_mark.column + 1)


class _Walker:
    """Builds plain data from composed nodes, filling the document's position maps."""

    def __init__(self, loader: _Loader, doc: Document) -> None:
        self.loader = loader
        self.doc = doc
        self.active: set[int] = set()  # ids of nodes being walked: an alias back to one recurses
        self.values = 0

    def fail(self, node: Node, path: KeyPath, message: str) -> TopologyError:
        where = _where(self.doc.file, node)
        return TopologyError(message, file=where.file, line=where.line, column=where.column,
                             key=format_path(path) or None)

    def walk(self, node: Node, path: KeyPath) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise self.fail(node, path, f"the document expands to more than {MAX_VALUES} values "
                                        "(nested aliases?)")
        self.doc.value_at[path] = _where(self.doc.file, node)
        if isinstance(node, ScalarNode):
            return self.loader.construct_object(node, deep=True)
        if id(node) in self.active:
            raise self.fail(node, path, "recursive YAML alias")
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return [self.walk(item, (*path, i)) for i, item in enumerate(node.value)]
            assert isinstance(node, MappingNode)
            return self.walk_mapping(node, path)
        finally:
            self.active.discard(id(node))

    def walk_mapping(self, node: MappingNode, path: KeyPath) -> dict[str, Any]:
        # Duplicates are checked among the mapping's own keys only: keys brought in by a '<<'
        # merge are meant to be overridden by the mapping's own.
        seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.key(key_node, path)
            if key in seen:
                first = seen[key].start_mark.line + 1
                raise self.fail(key_node, (*path, key),
                                f"duplicate key '{key}' (first defined on line {first})")
            seen[key] = key_node
        self.loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self.key(key_node, path)
            self.doc.key_at[(*path, key)] = _where(self.doc.file, key_node)
            out[key] = self.walk(value_node, (*path, key))
        return out

    def key(self, key_node: Node, path: KeyPath) -> str:
        key = self.loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise self.fail(key_node, path, f"keys must be strings, got {type(key).__name__} "
                                            f"{key!r}")
        return key


def _record(doc: Document, path: KeyPath, value: Any, where: Where) -> None:
    doc.value_at[path] = where
    doc.key_at[path] = where
    if isinstance(value, dict):
        for key, item in value.items():
            _record(doc, (*path, key), item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _record(doc, (*path, i), item, where)


def deep_merge(base: Any, top: Any) -> Any:
    """``top`` merged over ``base``: mappings merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(top, dict):
        out = dict(base)
        for key, value in top.items():
            out[key] = deep_merge(base[key], value) if key in base else value
        return out
    return top


def _exists(data: Any, path: KeyPath) -> bool:
    for part in path:
        if isinstance(part, int):
            if not (isinstance(data, list) and part < len(data)):
                return False
        elif not (isinstance(data, dict) and part in data):
            return False
        data = data[part]
    return True
