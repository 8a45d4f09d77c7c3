"""Per-policy templates: one copy of a process, actor or connection for each policy id.

A process or actor whose name contains ``<policy>`` is a template. Before the document is
checked, each template is written out once per policy id ``0 .. num_policies - 1``
(``settings.num_policies``, 1 when unset), with ``<policy>`` replaced by the id in its name and
everywhere inside it: a value that is exactly ``<policy>`` becomes the integer id, one that
contains it gets the digits. A process template's actors are copied with it, so each of their
names must contain ``<policy>`` too (names are unique across the topology).

An entry named like a copy (``learner_2`` beside ``learner_<policy>``) refines that copy: it is
merged over it as ``extends`` merges files, which is how ``--set
processes.learner.actors.learner_2.params.x=...`` sets one policy's value. A name like a copy
of a policy that does not exist is an error.

``<`` and ``>`` are plain characters in YAML, even inside flow mappings, where ``{policy}``
would not parse; so ``{from: batcher_<policy>.batch_ready, to: learner_<policy>.on_batch_ready}``
needs no quotes. Connections are written out by the loader (one per policy, both ends with the
same id), so that their errors keep pointing at the list item of the file.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from sfbus.topology.params import describe_value, suggest
from sfbus.topology.yaml_source import Document, KeyPath, deep_merge

PLACEHOLDER = "<policy>"
# A typo such as --set num_policies=100000 would build every copy (in every process of the run)
# before anything else could complain; no population on one machine comes near this.
MAX_POLICIES = 1024
_TOKEN = re.compile(r"<[^<>]*>?")


@dataclass(frozen=True)
class Origin:
    """The template a process or actor was copied from, and the policy id of the copy."""

    template: str
    policy: int


@dataclass
class Population:
    """A document with its per-policy templates written out, and where each copy came from."""

    doc: Document
    count: int
    """Copies of each template: ``settings.num_policies`` (1 when unset or when nothing is
    per-policy)."""
    processes: dict[str, Origin] = field(default_factory=dict)
    actors: dict[str, Origin] = field(default_factory=dict)
    actor_templates: set[str] = field(default_factory=set)
    """Names of the actor templates (``learner_<policy>``), for the connections' ends."""

    def missing_policy(self, name: str) -> str | None:
        """Why ``name`` is no actor when it looks like a copy of a policy that does not exist."""
        for template in sorted(self.actor_templates):
            policy = policy_of(name, template)
            if policy is not None and policy >= self.count:
                return (f"policy {policy} does not exist: '{template}' has one actor per policy "
                        f"0..{self.count - 1} (settings.num_policies = {self.count})")
        return None


def has_placeholder(text: str) -> bool:
    """Whether ``text`` names a per-policy template."""
    return PLACEHOLDER in text


def check_placeholders(text: str) -> str | None:
    """An error message for a ``<...>`` in ``text`` other than ``<policy>``, else None."""
    for token in _TOKEN.findall(text):
        if token != PLACEHOLDER:
            return f"unknown placeholder '{token}' in '{text}'{suggest(token, [PLACEHOLDER])}"
    return None


def policy_of(name: str, template: str) -> int | None:
    """The policy id for which ``template`` is written out as ``name``, or None."""
    head, _, tail = template.partition(PLACEHOLDER)
    match = re.fullmatch(re.escape(head) + r"(0|[1-9][0-9]*)" + re.escape(tail), name)
    return int(match.group(1)) if match else None


def substitute(value: Any, policy: int) -> Any:
    """A copy of ``value`` with ``<policy>`` replaced by ``policy`` in keys and values."""
    if value == PLACEHOLDER:
        return policy
    if isinstance(value, str):
        return value.replace(PLACEHOLDER, str(policy))
    if isinstance(value, dict):
        return {substitute(k, policy): substitute(v, policy) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, policy) for v in value]
    return value


def count_policies(doc: Document) -> int:
    """``settings.num_policies`` (1 when unset), checked to be an int in 1..MAX_POLICIES."""
    settings = doc.get(("settings",))
    if not isinstance(settings, dict) or "num_policies" not in settings:
        return 1
    count = settings["num_policies"]
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_POLICIES:
        raise doc.error(("settings", "num_policies"), f"expected an int in 1..{MAX_POLICIES} "
                        f"(the number of policies), got {describe_value(count)}")
    return count


def expand(doc: Document) -> Population:
    """``doc`` with every per-policy process and actor written out; ``doc`` is not changed."""
    procs = doc.get(("processes",))
    if not isinstance(procs, dict) or not _any_template(procs):
        return Population(doc, 1)  # num_policies is then the actors' business alone
    out = Document(doc.file, copy.deepcopy(doc.data), dict(doc.value_at), dict(doc.key_at))
    population = Population(out, count_policies(doc))
    for pname, process in procs.items():
        actors = process.get("actors") if isinstance(process, dict) else None
        if not isinstance(actors, dict):
            continue  # the loader reports a malformed process
        for aname in actors:
            if has_placeholder(pname) and not has_placeholder(aname):
                raise doc.error(("processes", pname, "actors", aname),
                                f"actor '{aname}' of per-policy process '{pname}' needs "
                                f"'{PLACEHOLDER}' in its name: the process has one copy per "
                                "policy, and actor names are unique", at_key=True)
            if has_placeholder(aname):
                population.actor_templates.add(aname)
    for pname, origin in _write_out(out, ("processes",), population.count).items():
        population.processes[pname] = origin
        process = procs[origin.template]
        actors = process.get("actors") if isinstance(process, dict) else None
        for template in actors if isinstance(actors, dict) else ():
            population.actors[substitute(template, origin.policy)] = Origin(template,
                                                                            origin.policy)
    for pname in list(out.data["processes"]):
        if pname not in population.processes:
            population.actors.update(_write_out(out, ("processes", pname, "actors"),
                                                population.count))
    return population


def _any_template(procs: dict[str, Any]) -> bool:
    return any(has_placeholder(p) or (isinstance(v, dict) and isinstance(v.get("actors"), dict)
                                      and any(has_placeholder(a) for a in v["actors"]))
               for p, v in procs.items())


def _write_out(doc: Document, path: KeyPath, count: int) -> dict[str, Origin]:
    """Replace the templates of the mapping at ``path`` by their copies; returns the copies."""
    mapping = doc.get(path)
    if not isinstance(mapping, dict):
        return {}
    templates = [key for key in mapping if has_placeholder(key)]
    if not templates:
        return {}
    copies: dict[str, Origin] = {}
    for template in templates:
        for policy in range(count):
            name = template.replace(PLACEHOLDER, str(policy))
            if name in copies:
                raise doc.error((*path, template), f"'{name}' would be a copy of both "
                                f"'{copies[name].template}' and '{template}'", at_key=True)
            copies[name] = Origin(template, policy)
    refined = {}
    for key in mapping:
        if key in copies:
            refined[key] = mapping[key]
        elif not has_placeholder(key):
            for template in templates:
                policy = policy_of(key, template)
                if policy is not None:  # in range it would be a copy: this one is beyond
                    raise doc.error((*path, key), f"'{key}' refines the copy of '{template}' "
                                    f"for policy {policy}, which does not exist "
                                    f"(settings.num_policies = {count})", at_key=True)
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
            written[name] = substitute(value, origin.policy)
            _move_positions(doc, (*path, key), (*path, name), origin.policy)
            if name in refined:
                written[name] = deep_merge(written[name], refined[name])
    _replace(doc, path, written)
    return copies


def _move_positions(doc: Document, source: KeyPath, target: KeyPath, policy: int) -> None:
    """Give the copy at ``target`` the positions of its template at ``source``."""
    for table in (doc.value_at, doc.key_at):
        for path, where in list(table.items()):
            if path[: len(source)] == source:
                rest = tuple(substitute(p, policy) if isinstance(p, str) else p
                             for p in path[len(source):])
                table.setdefault((*target, *rest), where)  # a refinement's own positions win


def _replace(doc: Document, path: KeyPath, written: dict[str, Any]) -> None:
    """Put ``written`` at ``path`` and forget the positions of the templates it replaced."""
    node = doc.data
    for part in path:
        node = node[part]
    node.clear()
    node.update(written)
    depth = len(path)
    for table in (doc.value_at, doc.key_at):
        for stale in [p for p in table if len(p) > depth and p[:depth] == path
                      and isinstance(p[depth], str) and has_placeholder(p[depth])]:
            del table[stale]
