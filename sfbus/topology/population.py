"""Templates: one copy of a process, actor or connection for each index of an index set.

A topology may name one index set, ``templates: {NAME: SETTING}``: the placeholder ``<NAME>``
and the setting that counts its indices (``settings.SETTING``, 1 when unset). Without that key
the index set is ``{policy: num_policies}``, the one every topology (and run snapshot) written
before the key existed uses; the kernel gives the name no meaning.

A process or actor whose name contains the placeholder is a template. Before the document is
checked, each template is written out once per index ``0 .. count - 1``, with the placeholder
replaced by the index in its name and everywhere inside it: a value that is exactly the
placeholder becomes the integer index, one that contains it gets the digits. A process
template's actors are copied with it, so each of their names must contain the placeholder too
(names are unique across the topology).

An entry named like a copy (``learner_2`` beside ``learner_<policy>``) refines that copy: it is
merged over it as ``extends`` merges files, which is how ``--set
processes.learner.actors.learner_2.params.x=...`` sets one copy's value. A name like a copy
of an index that does not exist is an error.

``<`` and ``>`` are plain characters in YAML, even inside flow mappings, where ``{policy}``
would not parse; so ``{from: batcher_<policy>.batch_ready, to: learner_<policy>.on_batch_ready}``
needs no quotes. Connections are written out by the loader (one per index, both ends with the
same index), so that their errors keep pointing at the list item of the file.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from sfbus.topology.params import describe_value, suggest
from sfbus.topology.yaml_source import Document, KeyPath, deep_merge

# A typo such as --set num_policies=100000 would build every copy (in every process of the run)
# before anything else could complain; no topology on one machine comes near this.
MAX_COPIES = 1024
_TOKEN = re.compile(r"<[^<>]*>?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class IndexSet:
    """The index set a topology's templates are written out over (``templates:``)."""

    name: str = "policy"
    """What an index is called: the placeholder is ``<name>``."""
    count: str = "num_policies"
    """The setting that holds how many indices there are (1 when unset)."""

    @property
    def placeholder(self) -> str:
        """``<name>``, which marks a template's name and stands for the index in its values."""
        return f"<{self.name}>"

    def has_placeholder(self, text: str) -> bool:
        """Whether ``text`` names a template."""
        return self.placeholder in text

    def check_placeholders(self, text: str) -> str | None:
        """An error message for a ``<...>`` in ``text`` other than the placeholder, else None."""
        for token in _TOKEN.findall(text):
            if token != self.placeholder:
                return (f"unknown placeholder '{token}' in '{text}'"
                        f"{suggest(token, [self.placeholder])}")
        return None


def read_index_set(doc: Document) -> IndexSet:
    """The document's ``templates: {NAME: SETTING}`` (the default index set when absent)."""
    declared = doc.get(("templates",))
    if declared is None:
        return IndexSet()
    if not (isinstance(declared, dict) and len(declared) == 1):
        raise doc.error(("templates",), "expected one index set, {NAME: SETTING} (the "
                        f"placeholder <NAME>, counted by settings.SETTING), got "
                        f"{describe_value(declared)}")
    ((name, count),) = declared.items()
    for text, what in ((name, "name"), (count, "setting")):
        if not (isinstance(text, str) and _NAME.fullmatch(text)):
            raise doc.error(("templates", name),
                            f"the index set's {what} must be an identifier, got "
                            f"{describe_value(text)}", at_key=what == "name")
    return IndexSet(name, count)


@dataclass(frozen=True)
class Origin:
    """The template a process or actor was copied from, and the index of the copy."""

    template: str
    index: int


@dataclass
class Population:
    """A document with its templates written out, and where each copy came from."""

    doc: Document
    index: IndexSet
    count: int
    """Copies of each template: the index set's setting (1 when unset or when there is no
    template)."""
    processes: dict[str, Origin] = field(default_factory=dict)
    actors: dict[str, Origin] = field(default_factory=dict)
    actor_templates: set[str] = field(default_factory=set)
    """Names of the actor templates (``learner_<policy>``), for the connections' ends."""

    def missing_copy(self, name: str) -> str | None:
        """Why ``name`` is no actor when it looks like a copy of an index that does not exist."""
        index = self.index
        for template in sorted(self.actor_templates):
            i = index_of(name, template, index)
            if i is not None and i >= self.count:
                return (f"{index.name} {i} does not exist: '{template}' has one actor per "
                        f"{index.name} 0..{self.count - 1} (settings.{index.count} = "
                        f"{self.count})")
        return None


def index_of(name: str, template: str, index: IndexSet) -> int | None:
    """The index for which ``template`` is written out as ``name``, or None."""
    head, _, tail = template.partition(index.placeholder)
    match = re.fullmatch(re.escape(head) + r"(0|[1-9][0-9]*)" + re.escape(tail), name)
    return int(match.group(1)) if match else None


def substitute(value: Any, placeholder: str, i: int) -> Any:
    """A copy of ``value`` with ``placeholder`` replaced by ``i`` in keys and values."""
    if value == placeholder:
        return i
    if isinstance(value, str):
        return value.replace(placeholder, str(i))
    if isinstance(value, dict):
        return {substitute(k, placeholder, i): substitute(v, placeholder, i)
                for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, placeholder, i) for v in value]
    return value


def count_copies(doc: Document, index: IndexSet) -> int:
    """The index set's setting (1 when unset), checked to be an int in 1..MAX_COPIES."""
    settings = doc.get(("settings",))
    if not isinstance(settings, dict) or index.count not in settings:
        return 1
    count = settings[index.count]
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COPIES:
        raise doc.error(("settings", index.count), f"expected an int in 1..{MAX_COPIES} "
                        f"(the number of indices of <{index.name}>), got {describe_value(count)}")
    return count


def expand(doc: Document, index: IndexSet) -> Population:
    """``doc`` with every template process and actor written out; ``doc`` is not changed."""
    procs = doc.get(("processes",))
    if not isinstance(procs, dict) or not _any_template(procs, index):
        return Population(doc, index, 1)  # the count is then the actors' business alone
    out = Document(doc.file, copy.deepcopy(doc.data), dict(doc.value_at), dict(doc.key_at))
    population = Population(out, index, count_copies(doc, index))
    for pname, process in procs.items():
        actors = process.get("actors") if isinstance(process, dict) else None
        if not isinstance(actors, dict):
            continue  # the loader reports a malformed process
        for aname in actors:
            if index.has_placeholder(pname) and not index.has_placeholder(aname):
                raise doc.error(("processes", pname, "actors", aname),
                                f"actor '{aname}' of template process '{pname}' needs "
                                f"'{index.placeholder}' in its name: the process has one copy "
                                f"per {index.name}, and actor names are unique", at_key=True)
            if index.has_placeholder(aname):
                population.actor_templates.add(aname)
    for pname, origin in _write_out(out, ("processes",), population).items():
        population.processes[pname] = origin
        process = procs[origin.template]
        actors = process.get("actors") if isinstance(process, dict) else None
        for template in actors if isinstance(actors, dict) else ():
            name = substitute(template, index.placeholder, origin.index)
            population.actors[name] = Origin(template, origin.index)
    for pname in list(out.data["processes"]):
        if pname not in population.processes:
            population.actors.update(_write_out(out, ("processes", pname, "actors"), population))
    return population


def _any_template(procs: dict[str, Any], index: IndexSet) -> bool:
    return any(index.has_placeholder(p)
               or (isinstance(v, dict) and isinstance(v.get("actors"), dict)
                   and any(index.has_placeholder(a) for a in v["actors"]))
               for p, v in procs.items())


def _write_out(doc: Document, path: KeyPath, population: Population) -> dict[str, Origin]:
    """Replace the templates of the mapping at ``path`` by their copies; returns the copies."""
    mapping = doc.get(path)
    index, count = population.index, population.count
    if not isinstance(mapping, dict):
        return {}
    templates = [key for key in mapping if index.has_placeholder(key)]
    if not templates:
        return {}
    copies: dict[str, Origin] = {}
    for template in templates:
        for i in range(count):
            name = template.replace(index.placeholder, str(i))
            if name in copies:
                raise doc.error((*path, template), f"'{name}' would be a copy of both "
                                f"'{copies[name].template}' and '{template}'", at_key=True)
            copies[name] = Origin(template, i)
    refined = {}
    for key in mapping:
        if key in copies:
            refined[key] = mapping[key]
        elif not index.has_placeholder(key):
            for template in templates:
                i = index_of(key, template, index)
                if i is not None:  # in range it would be a copy: this one is beyond
                    raise doc.error((*path, key), f"'{key}' refines the copy of '{template}' "
                                    f"for {index.name} {i}, which does not exist "
                                    f"(settings.{index.count} = {count})", at_key=True)
    written: dict[str, Any] = {}
    for key, value in mapping.items():
        if key in refined:
            continue  # merged into its copy, in the template's place
        if key not in templates:
            written[key] = value
            continue
        for name, origin in copies.items():
            if origin.template != key:
                continue
            written[name] = substitute(value, index.placeholder, origin.index)
            _move_positions(doc, (*path, key), (*path, name), index.placeholder, origin.index)
            if name in refined:
                written[name] = deep_merge(written[name], refined[name])
    _replace(doc, path, written, index)
    return copies


def _move_positions(doc: Document, source: KeyPath, target: KeyPath, placeholder: str,
                    i: int) -> None:
    """Give the copy at ``target`` the positions of its template at ``source``."""
    for table in (doc.value_at, doc.key_at):
        for path, where in list(table.items()):
            if path[: len(source)] == source:
                rest = tuple(substitute(p, placeholder, i) if isinstance(p, str) else p
                             for p in path[len(source):])
                table.setdefault((*target, *rest), where)  # a refinement's own positions win


def _replace(doc: Document, path: KeyPath, written: dict[str, Any], index: IndexSet) -> None:
    """Put ``written`` at ``path`` and forget the positions of the templates it replaced."""
    node = doc.data
    for part in path:
        node = node[part]
    node.clear()
    node.update(written)
    depth = len(path)
    for table in (doc.value_at, doc.key_at):
        for stale in [p for p in table if len(p) > depth and p[:depth] == path
                      and isinstance(p[depth], str) and index.has_placeholder(p[depth])]:
            del table[stale]
