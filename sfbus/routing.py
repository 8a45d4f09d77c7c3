"""Compiles a topology into process and actor instances and numbered edges.

Every process derives the same table from the same topology snapshot, so a frame can name an edge
by its integer id and the receiver knows the target actor, slot and payload type without any
negotiation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import msgspec

from sfbus.errors import TopologyError
from sfbus.messages import Message
from sfbus.records import RunRecords, record_key
from sfbus.shm import ArraySpec
from sfbus.topology import import_actor_class
from sfbus.topology.model import ActorSpec, Location, ProcessSpec, Topology, instance_name


@dataclass(frozen=True)
class ActorInstance:
    """One running copy of an actor."""

    name: str
    spec: ActorSpec
    process: str
    replica: int

    @cached_property
    def cls(self) -> type:
        """The actor class, imported on first use."""
        return import_actor_class(self.spec.class_path)


@dataclass(frozen=True)
class ProcessInstance:
    """One OS process of the run; ``index`` is its id on the wire."""

    name: str
    spec: ProcessSpec
    replica: int
    index: int
    actors: tuple[ActorInstance, ...]


@dataclass(frozen=True)
class Edge:
    """One signal of one actor instance delivered to one slot of another."""

    id: int
    source: str
    signal: str
    target: str
    slot: str
    process: str
    payload: type[Message]
    coalesce_s: float = 0.0


@dataclass(frozen=True)
class Route:
    """What one emission of ``source.signal`` does: all edges (broadcast) or one of them (any)."""

    source: str
    signal: str
    mode: str
    edges: tuple[Edge, ...]


class RoutingTable:
    """Instances and edges of a topology, identical in every process of a run."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        processes: list[ProcessInstance] = []
        self.actors: dict[str, ActorInstance] = {}
        replicas_of: dict[str, list[ActorInstance]] = {}
        for spec in topology.processes:
            for replica in range(spec.replicas):
                pname = instance_name(spec.name, replica, spec.replicas)
                actors = tuple(
                    ActorInstance(instance_name(a.name, replica, spec.replicas), a, pname, replica)
                    for a in spec.actors
                )
                for actor in actors:
                    self.actors[actor.name] = actor
                    replicas_of.setdefault(actor.spec.name, []).append(actor)
                processes.append(ProcessInstance(pname, spec, replica, len(processes), actors))
        self.processes = {p.name: p for p in processes}

        edges: list[Edge] = []
        self.routes: dict[str, list[Route]] = {}
        for conn in topology.connections:
            for source in replicas_of[conn.source]:
                payload = source.cls.signal_types()[conn.signal]
                route_edges = []
                targets = replicas_of[conn.target]
                if conn.mode == "local":
                    targets = [t for t in targets if t.process == source.process]
                    if not targets:
                        raise _error_at(f"mode local: {source.name} has no {conn.target} in its "
                                        f"process {source.process}", conn.location,
                                        topology.path, f"connection {conn.source}.{conn.signal}")
                for target in targets:
                    edge = Edge(len(edges), source.name, conn.signal, target.name, conn.slot,
                                target.process, payload, conn.coalesce_s)
                    edges.append(edge)
                    route_edges.append(edge)
                route = Route(source.name, conn.signal, conn.mode, tuple(route_edges))
                self.routes.setdefault(source.name, []).append(route)
        self.edges = tuple(edges)

    @cached_property
    def records(self) -> RunRecords:
        """The run records the actors list (``Actor.records``), each computed once, in the
        order actors appear; one that cannot be computed is a TopologyError at the place of the
        first actor that lists it."""
        encoded: dict[str, bytes] = {}
        for actor in self.actors.values():
            for record_type in actor.cls.records:
                key = record_key(record_type)
                if key in encoded:
                    continue
                try:
                    # Stored as JSON here too, so the launcher reads exactly what children do.
                    encoded[key] = msgspec.json.encode(record_type.from_topology(self.topology))
                except Exception as error:
                    raise self._actor_error(actor, error, "computing its run record "
                                            f"{record_type.__qualname__}") from None
        return RunRecords(encoded)

    def array_specs(self) -> list[ArraySpec]:
        """Every shared array the run's actors declare, checked before anything starts.

        An actor that cannot size its buffers from its parameters (``ValueError``), or whose
        code raises while it tries (a user's env factory that fails, say), is reported as a
        TopologyError at that actor's place in the file.
        """
        records = self.records
        specs: list[ArraySpec] = []
        for actor in self.actors.values():
            try:
                specs.extend(actor.cls.shared_arrays(actor.name, actor.spec.params,
                                                     self.topology, records))
            except Exception as error:
                raise self._actor_error(actor, error, "sizing its shared arrays") from None
        return specs

    def _actor_error(self, actor: ActorInstance, error: Exception, doing: str) -> TopologyError:
        """A launch hook of ``actor`` raised: a ValueError is the topology's fault and says why;
        anything else is the actor's (or its env's) code failing, named with what it did."""
        message = str(error) if isinstance(error, ValueError) else \
            f"{doing} failed: {type(error).__name__}: {error}"
        return _error_at(message, actor.spec.location, self.topology.path,
                         f"actor {actor.spec.name!r}")

    def stop_order(self, processes: Iterable[str]) -> list[str]:
        """``processes`` in the order their actors stop on one loop (serial mode): each before
        the processes its signals reach that never reach it back, so that what an actor sends
        from its ``on_stop`` (a rollout worker's last progress) finds its receivers (the
        statistics) still running; processes that reach each other by name, last first."""
        sends: dict[str, set[str]] = {p: set() for p in self.processes}
        for edge in self.edges:
            sends[self.actors[edge.source].process].add(edge.process)

        def reach(process: str) -> int:
            seen, todo = {process}, [process]
            while todo:
                for target in sends[todo.pop()] - seen:
                    seen.add(target)
                    todo.append(target)
            return len(seen)
        # a process reaching another that does not reach it back reaches strictly more
        return sorted(sorted(processes, reverse=True), key=lambda p: -reach(p))

    def edges_into(self, process: str) -> dict[int, Edge]:
        """Edges whose target lives in ``process``, by id."""
        return {e.id: e for e in self.edges if e.process == process}

    def senders_to(self, process: str) -> set[int]:
        """Wire ids of the processes that may send data frames to ``process``."""
        return {
            self.processes[self.actors[e.source].process].index
            for e in self.edges
            if e.process == process
        }


def _error_at(message: str, where: Location | None, file: str, key: str) -> TopologyError:
    """A TopologyError at ``where`` in the topology (or naming only ``file`` when unknown)."""
    return TopologyError(message, file=where.file if where else file,
                         line=where.line if where else None,
                         column=where.column if where else None, key=key)
