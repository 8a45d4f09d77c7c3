"""Load a topology file into a validated :class:`~sfbus.topology.model.Topology`.

File format::

    extends: base.yaml      # optional; path relative to this file. Mappings merge deeply, this
                            # file wins; lists and scalars are replaced whole. Chains are allowed,
                            # cycles are an error. 'name' is not inherited.
    name: demo              # optional, default: the file's stem
    settings:               # shared values: an actor parameter missing from the actor's own
      total: 10000          # 'params' is taken from here when a key of the same name exists
    run:                    # optional, fields of RunSettings, type-checked like params
      heartbeat_timeout_s: 20
    processes:
      producer:             # process name
        replicas: 1         # int in 1..1024, or auto: one per CPU core of the machine
        restart: on-failure # always | on-failure | never
        cpu_affinity: [0, 1] # optional CPU ids; with replicas, replica i gets core ids[i % n];
                             # auto: every core of the machine (so replica i gets core i)
        nice: 0             # -20 .. 19
        scheduling: normal  # normal | batch: Linux's SCHED_BATCH for it and what it starts
        actors:
          producer:         # actor name, unique across the whole topology
            class: sfbus.demo:Producer   # "module:Class", a subclass of sfbus.actor.Actor
            params: {count: 100}
    connections:
      - from: producer.item_ready        # actor.signal
        to: consumer.on_item_ready       # actor.slot
        mode: broadcast                  # broadcast (default) | any | local
        coalesce_s: 0.0                  # optional: may wait this long to share a frame

Templates (``sfbus.topology.population``): the topology names one index set, ``templates:
{NAME: SETTING}`` (``{policy: num_policies}`` when it names none); a process or actor whose name
contains ``<NAME>`` is written out once per index 0 .. ``settings.SETTING`` - 1 (1 when unset),
with ``<NAME>`` replaced by the index in its name and values (a value that is exactly ``<NAME>``
becomes the int)::

    templates: {policy: num_policies}   # the default, so optional
    settings: {num_policies: 4}
    processes:
      learner:
        actors:
          learner_<policy>: {class: sfbus_components.learning.learner:Learner,
                             params: {policy: <policy>}}
          learner_2: {params: {appo: {lr: 1e-3}}}   # optional: refines policy 2's copy
    connections:   # an end named with <policy>: one connection per policy, same id at both ends
      - {from: batcher_<policy>.batch_ready, to: learner_<policy>.on_batch_ready}
      - {from: learner_<policy>.training_stats, to: stats.on_training_stats}

An actor parameter resolves to: its ``params`` value, else ``settings[field]``, else the field's
default; a required field missing everywhere is an error, and so is an unknown key in ``params``.

``--set a.b.c=value`` overrides are applied to the merged document before it is checked. The
value is parsed as YAML (``3``, ``1e-3``, ``[1, 2]``, ``on-failure``). A path whose first part is
not a top-level key means ``settings.<path>`` (``--set lr=0.001``). Only mappings can be walked
into; a step through a list or a scalar is an error.

Every error is a :class:`~sfbus.errors.TopologyError` printed as one line,
``file:line:col: key.path: message``; a name that is not found ends with
``; did you mean 'x'?`` when a close one exists. Values from ``--set`` are reported as
``--set: key.path: message``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Any

from sfbus.errors import TopologyError
from sfbus.topology.classes import import_actor_class
from sfbus.topology.documents import TOP_KEYS, apply_override, load_chain
from sfbus.topology.model import (
    ActorSpec,
    ConnectionSpec,
    DeliveryMode,
    Location,
    ProcessSpec,
    RestartPolicy,
    RunSettings,
    SchedulingPolicy,
    Topology,
)
from sfbus.topology.params import ParamError, build_dataclass, convert, describe_value, suggest
from sfbus.topology.population import (
    IndexSet,
    Population,
    expand,
    read_index_set,
)
from sfbus.topology.yaml_source import Document, KeyPath, Where

# One OS process per replica: beyond this no machine runs them, and a typo (1000000) would
# otherwise spend minutes building the routing table before any error.
MAX_REPLICAS = 1024
PROCESS_KEYS = ("replicas", "restart", "cpu_affinity", "nice", "scheduling", "actors")
ACTOR_KEYS = ("class", "params")
CONNECTION_KEYS = ("from", "to", "mode", "coalesce_s")
# Names end up in socket paths, metric labels and 'actor.signal' references: no dots or spaces.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


def load_topology(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Topology:
    """Read, merge (``extends``), override (``--set``) and validate a topology file.

    Imports every actor class it names. Raises :class:`TopologyError` on any problem.
    """
    file = os.fspath(path)
    doc = load_chain(file)
    for text in overrides:
        apply_override(doc, text)
    return _Builder(doc, os.path.splitext(os.path.basename(file))[0]).build()


def _location(where: Where) -> Location | None:
    if where.line is None:
        return None
    return Location(where.file, where.line, where.column or 1)


class _Builder:
    """Checks a merged document and builds the model; raises at the first problem."""

    def __init__(self, doc: Document, default_name: str) -> None:
        self.doc = doc
        self.default_name = default_name
        self.actor_classes: dict[str, type] = {}
        self.members: dict[type, tuple[dict[str, type], dict[str, type]]] = {}
        self.population: Population  # the document with its templates' copies, set by build()
        self.index = IndexSet()  # what templates are written out over, set by build()

    def fail(self, path: KeyPath, message: str, *, at_key: bool = False) -> TopologyError:
        return self.doc.error(path, message, at_key=at_key)

    def mapping(self, path: KeyPath, allowed: Sequence[str] = (), *,
                required: Sequence[str] = ()) -> dict[str, Any]:
        value = self.doc.get(path)
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {describe_value(value)}")
        for key in value:
            if allowed and key not in allowed:
                raise self.fail((*path, key), f"unknown key '{key}'{suggest(key, allowed)}",
                                at_key=True)
        for key in required:
            if key not in value:
                raise self.fail(path, f"missing required key '{key}'")
        return value

    def typed(self, path: KeyPath, tp: Any, default: Any = None) -> Any:
        if not _has(self.doc, path):
            return default
        try:
            return convert(self.doc.get(path), tp, path)
        except ParamError as error:
            raise self.fail(error.path, error.message, at_key=error.at_key) from None

    def typed_or_auto(self, path: KeyPath, tp: Any, default: Any, auto: Any) -> Any:
        """Like :meth:`typed`, except that the string ``auto`` stands for ``auto``."""
        if _has(self.doc, path) and self.doc.get(path) == "auto":
            return auto
        return self.typed(path, tp, default)

    def name(self, path: KeyPath, kind: str) -> None:
        problem = self.index.check_placeholders(str(path[-1]))
        if problem:
            raise self.fail(path, problem, at_key=True)
        if not _NAME.match(path[-1]):  # type: ignore[arg-type]
            raise self.fail(path, f"invalid {kind} name '{path[-1]}': use letters, digits, '_' "
                                  "and '-', starting with a letter or '_'", at_key=True)

    def build(self) -> Topology:
        top = self.mapping((), TOP_KEYS)
        name = self.typed(("name",), str, self.default_name)
        settings = dict(self.mapping(("settings",))) if top.get("settings") is not None else {}
        run = RunSettings()
        if top.get("run") is not None:
            run = self.dataclass(("run",), RunSettings, None, noun="run setting", owner="")
        source = self.doc
        self.index = read_index_set(source)
        self.population = expand(source, self.index)
        self.doc = self.population.doc
        processes = self.processes()
        self.check_settings_used(settings, processes)
        return Topology(
            name=name,
            path=self.doc.file,
            processes=processes,
            connections=self.connections(),
            settings=settings,
            run=run,
            index_name=self.index.name,
            document=source.data,  # as written: every process writes the copies out again
        )

    def check_settings_used(self, settings: dict[str, Any],
                            processes: tuple[ProcessSpec, ...]) -> None:
        """Every shared setting must be a parameter of some actor: a misspelt one is an error."""
        fields = {f.name for p in processes for a in p.actors
                  for f in dataclasses.fields(a.params)}
        if self.population.actor_templates:
            fields.add(self.index.count)  # the loader reads it: how many copies of each template
        for key in settings:
            if key in fields:
                continue
            message = f"unknown setting '{key}': no actor of this topology has such a parameter"
            owner = next((p for p in processes if p.name == key
                          or any(a.name == key for a in p.actors)), None)
            if owner is not None:  # '--set learner.x=1' meant an actor's parameter
                actor = key if any(a.name == key for a in owner.actors) else "ACTOR"
                message += (f"; an actor's own parameter is set by its path, "
                            f"processes.{owner.name}.actors.{actor}.params.<name>")
            else:
                message += suggest(str(key), sorted(fields))
            raise self.fail(("settings", key), message, at_key=True)

    def dataclass(self, path: KeyPath, cls: type, actor: str | None, *, noun: str,
                  owner: str) -> Any:
        given = self.doc.get(path)
        if given is None:
            given = {}
        elif not isinstance(given, dict):
            raise self.fail(path, f"expected a mapping, got {describe_value(given)}")
        fallback = self.doc.get(("settings",)) if actor else None
        try:
            return build_dataclass(cls, given, fallback, noun=noun, owner=owner)
        except ParamError as error:
            message, base, at_key = error.message, path, error.at_key
            if error.source == "missing" and not _has(self.doc, path):
                base, at_key = path[:-1], True  # no 'params:' written: point at the actor's name
            elif error.source == "fallback":
                base = ("settings",)
                message += f" (parameter '{error.path[0]}' of actor '{actor}')"
            raise self.fail((*base, *error.path), message, at_key=at_key) from None
        except TypeError as error:  # unresolvable annotations in the class
            raise self.fail(path, str(error)) from None

    def processes(self) -> tuple[ProcessSpec, ...]:
        procs = self.mapping(("processes",)) if _has(self.doc, ("processes",)) else {}
        if not procs:
            raise self.fail(("processes",), "a topology needs at least one process")
        specs = []
        owner_of: dict[str, str] = {}
        for pname in procs:
            path: KeyPath = ("processes", pname)
            self.name(path, "process")
            self.mapping(path, PROCESS_KEYS, required=("actors",))
            cores = len(os.sched_getaffinity(0))  # the run's cores (a rank's share)
            replicas = self.typed_or_auto((*path, "replicas"), int, 1, cores)
            if not 1 <= replicas <= MAX_REPLICAS:
                raise self.fail((*path, "replicas"),
                                f"expected an int in 1..{MAX_REPLICAS}, got {replicas}")
            restart = self.typed((*path, "restart"), RestartPolicy, "on-failure")
            affinity = self.typed_or_auto((*path, "cpu_affinity"), tuple[int, ...] | None, None,
                                          tuple(range(cores)))
            if affinity and min(affinity) < 0:
                raise self.fail((*path, "cpu_affinity"), "CPU ids must be >= 0")
            nice = self.typed((*path, "nice"), int, 0)
            if not -20 <= nice <= 19:
                raise self.fail((*path, "nice"), f"expected an int in -20..19, got {nice}")
            scheduling = self.typed((*path, "scheduling"), SchedulingPolicy, "normal")
            actors = self.mapping((*path, "actors"))
            if not actors:
                raise self.fail((*path, "actors"), f"process '{pname}' has no actors")
            specs_a = []
            for aname in actors:
                apath: KeyPath = (*path, "actors", aname)
                if aname in owner_of:
                    raise self.fail(apath, f"duplicate actor name '{aname}' (also in process "
                                           f"'{owner_of[aname]}')", at_key=True)
                owner_of[aname] = pname
                specs_a.append(self.actor(apath))
            origin = self.population.processes.get(pname)
            specs.append(ProcessSpec(
                name=pname, actors=tuple(specs_a), replicas=replicas,
                restart=restart, cpu_affinity=affinity, nice=nice, scheduling=scheduling,
                location=_location(self.doc.where(path, at_key=True)),
                template=origin.template if origin else None,
                index=origin.index if origin else None))
        return tuple(specs)

    def actor(self, path: KeyPath) -> ActorSpec:
        name = str(path[-1])
        self.name(path, "actor")
        self.mapping(path, ACTOR_KEYS, required=("class",))
        class_path = self.typed((*path, "class"), str)
        try:
            cls = import_actor_class(class_path)
            self.members[cls] = (cls.signal_types(), cls.slot_types())  # type: ignore[attr-defined]
        except TopologyError as error:
            raise self.fail((*path, "class"), error.message) from None
        except TypeError as error:  # a badly declared signal or slot in the class
            raise self.fail((*path, "class"), f"'{class_path}': {error}") from None
        self.actor_classes[name] = cls
        params_cls = getattr(cls, "Params", None)
        if not (isinstance(params_cls, type) and dataclasses.is_dataclass(params_cls)):
            raise self.fail((*path, "class"), f"'{class_path}': Params must be a dataclass")
        params = self.dataclass((*path, "params"), params_cls, name, noun="parameter",
                                owner=class_path)
        origin = self.population.actors.get(name)
        return ActorSpec(name=name, class_path=class_path, params=params,
                         location=_location(self.doc.where(path, at_key=True)),
                         template=origin.template if origin else None,
                         index=origin.index if origin else None)

    def connections(self) -> tuple[ConnectionSpec, ...]:
        items = self.doc.get(("connections",)) or []
        if not isinstance(items, list):
            raise self.fail(("connections",), "expected a list of connections, got "
                                              f"{describe_value(items)}")
        specs: list[ConnectionSpec] = []
        seen: dict[tuple[str, str, str, str], int] = {}
        for i in range(len(items)):
            path: KeyPath = ("connections", i)
            self.mapping(path, CONNECTION_KEYS, required=("from", "to"))
            ends = (self.typed((*path, "from"), str), self.typed((*path, "to"), str))
            indices: list[int | None] = [None]
            placeholder = self.index.placeholder
            if any(placeholder in text for text in ends):
                self.template_endpoint((*path, "from"), ends[0])
                self.template_endpoint((*path, "to"), ends[1])
                indices = list(range(self.population.count))
            mode = self.typed((*path, "mode"), DeliveryMode, "broadcast")
            coalesce = self.typed((*path, "coalesce_s"), float, 0.0)
            if coalesce < 0:
                raise self.fail((*path, "coalesce_s"), f"must be >= 0, got {coalesce:g}")
            for index in indices:  # one copy per index when an end is a template
                copy = [t if index is None else t.replace(placeholder, str(index)) for t in ends]
                source, signal = self.endpoint((*path, "from"), copy[0], "signal")
                target, slot = self.endpoint((*path, "to"), copy[1], "slot")
                self.check_payload((*path, "to"), source, signal, target, slot)
                link = (source, signal, target, slot)
                if link in seen:
                    raise self.fail(path, f"duplicate connection (same as "
                                          f"connections[{seen[link]}])")
                seen[link] = i
                specs.append(ConnectionSpec(
                    source=source, signal=signal, target=target, slot=slot, mode=mode,
                    coalesce_s=coalesce, location=_location(self.doc.where(path)), index=index))
        return tuple(specs)

    def check_payload(self, path: KeyPath, source: str, signal: str, target: str,
                      slot: str) -> None:
        carried = self.members[self.actor_classes[source]][0][signal]
        expected = self.members[self.actor_classes[target]][1][slot]
        if carried is not expected:
            shown, wanted = _type_names(carried, expected)
            raise self.fail(path, f"signal '{signal}' of actor '{source}' carries {shown} but "
                                  f"slot '{slot}' of actor '{target}' expects {wanted}")

    def template_endpoint(self, path: KeyPath, text: str) -> None:
        """An end of a template connection names a template actor, or a plain one."""
        actor, _, member = text.partition(".")
        index = self.index
        if index.has_placeholder(member):
            raise self.fail(path, f"'{index.placeholder}' may stand only in the actor's name, "
                                  f"got '{text}'")
        templates = self.population.actor_templates
        if index.has_placeholder(actor) and actor not in templates:
            known = (suggest(actor, sorted(templates)) if templates else
                     f"; no actor of this topology is per-{index.name} (named with "
                     f"'{index.placeholder}')")
            raise self.fail(path, f"unknown per-{index.name} actor '{actor}'{known}")

    def endpoint(self, path: KeyPath, text: str, kind: str) -> tuple[str, str]:
        problem = self.index.check_placeholders(text)
        if problem:
            raise self.fail(path, problem)
        actor, dot, member = text.partition(".")
        if not (dot and actor and member) or "." in member:
            raise self.fail(path, f"expected 'actor.{kind}', got '{text}'")
        if actor not in self.actor_classes:
            missing = self.population.missing_copy(actor)
            raise self.fail(path, f"unknown actor '{actor}'" + (
                f": {missing}" if missing else suggest(actor, self.actor_classes)))
        signals, slots = self.members[self.actor_classes[actor]]
        names = signals if kind == "signal" else slots
        if member not in names:
            raise self.fail(path, f"unknown {kind} '{member}' of actor '{actor}'"
                                  f"{suggest(member, list(names))}")
        return actor, member


def _has(doc: Document, path: KeyPath) -> bool:
    return doc.get(path, _MISSING) is not _MISSING


_MISSING = object()


def _type_names(a: type, b: type) -> tuple[str, str]:
    """Bare class names, qualified by module when two different classes share a name."""
    if a.__qualname__ == b.__qualname__:
        return f"{a.__module__}.{a.__qualname__}", f"{b.__module__}.{b.__qualname__}"
    return a.__qualname__, b.__qualname__
