"""Typed, frozen objects a topology file compiles into; every process of a run reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sfbus.topology.classes import import_actor_class
from sfbus.topology.params import Interval, Seconds

RestartPolicy = Literal["always", "on-failure", "never"]
SchedulingPolicy = Literal["normal", "batch"]
DeliveryMode = Literal["broadcast", "any", "local"]


@dataclass(frozen=True)
class Location:
    """Where a value came from in a topology file, for error messages."""

    file: str
    line: int
    column: int


@dataclass(frozen=True)
class ActorSpec:
    """One actor of a process: its name, class import path and validated parameters.

    ``params`` is an instance of the actor class's ``Params`` dataclass.
    """

    name: str
    class_path: str
    params: Any
    location: Location | None = None
    template: str | None = None
    """For a template's copy: the name it was written as (``learner_<policy>``)."""
    index: int | None = None
    """For a template's copy: its index in the topology's index set."""


@dataclass(frozen=True)
class ProcessSpec:
    """One topology process; ``replicas`` copies of it run as separate OS processes."""

    name: str
    actors: tuple[ActorSpec, ...]
    replicas: int = 1
    restart: RestartPolicy = "on-failure"
    cpu_affinity: tuple[int, ...] | None = None
    nice: int = 0
    scheduling: SchedulingPolicy = "normal"
    """Linux's policy for the process and what it starts: ``batch`` (SCHED_BATCH) keeps the
    processes it wakes from preempting it, and it from preempting them."""
    location: Location | None = None
    template: str | None = None
    """For a template's copy: the name it was written as (``learner_<policy>``)."""
    index: int | None = None
    """For a template's copy: its index in the topology's index set."""


@dataclass(frozen=True)
class ConnectionSpec:
    """A signal of one actor wired to a slot of another.

    ``broadcast`` delivers to every replica of the target; ``any`` to one replica chosen by the
    sender (round-robin, or by the emit's ``key``); ``local`` to the replicas that live in the
    sender's own process (a call on the same event loop, nothing on the wire), and it is an error
    for a sender to have none.
    """

    source: str
    signal: str
    target: str
    slot: str
    mode: DeliveryMode = "broadcast"
    coalesce_s: Seconds = 0.0
    """Seconds a delivery to another process may wait to share a frame with later ones (for
    statistics: fewer wake-ups of the receiver); 0 sends it when the loop iteration ends."""
    location: Location | None = None
    index: int | None = None
    """For a copy of a template connection (an end named ``x_<policy>``): its index."""


@dataclass(frozen=True)
class RunSettings:
    """Supervision settings of a run (the topology's ``run:`` section)."""

    heartbeat_interval_s: Interval = 1.0
    """Seconds between a process's heartbeats."""
    heartbeat_timeout_s: Seconds = 30.0
    """A started process silent this long is reported and killed (then restarted)."""
    start_timeout_s: Seconds = 60.0
    """A process that has not started (Ready, then every ``on_start`` done) in this time is
    killed (then restarted)."""
    stop_timeout_s: Seconds = 10.0
    """Seconds a process gets to stop gracefully before it is killed."""
    max_restarts: int = 3
    """Restarts of one process allowed within ``restart_window_s``; one more fails the run."""
    restart_window_s: Seconds = 60.0
    """The sliding window the restarts are counted in."""
    max_actor_failures: int = 50
    """Failures one actor's code may have within ``actor_failure_window_s`` (slots, timers,
    tasks that raise, which the kernel contains): one more ends the actor's process (exit 1),
    which its restart policy restarts or which fails the run. 0: no limit."""
    actor_failure_window_s: Seconds = 300.0
    """The sliding window an actor's failures are counted in."""
    progress_timeout_s: Seconds = 300.0
    """A kind of progress an actor counts (``Actor.report_advance``: env frames, trained
    batches, ...) that stands still this long ends the run with exit 1, naming the actor and
    what it last did; longer than any pause a run makes on purpose (a checkpoint, a PBT
    exchange). 0: not watched."""
    metrics_port: int = 0
    """Serve Prometheus metrics on this TCP port (0: off)."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics endpoint binds."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval_s", "heartbeat_timeout_s", "start_timeout_s",
                     "stop_timeout_s", "restart_window_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if not 0 <= self.progress_timeout_s < float("inf"):
            raise ValueError(f"progress_timeout_s must be >= 0 (0: not watched), got "
                             f"{self.progress_timeout_s}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(f"heartbeat_timeout_s must be > heartbeat_interval_s "
                             f"({self.heartbeat_interval_s:g}), got {self.heartbeat_timeout_s:g}")
        if self.max_actor_failures < 0:
            raise ValueError(f"max_actor_failures must be >= 0 (0: no limit), got "
                             f"{self.max_actor_failures}")
        if not 0 < self.actor_failure_window_s < float("inf"):
            raise ValueError(f"actor_failure_window_s must be a finite number > 0, got "
                             f"{self.actor_failure_window_s}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be a TCP port in 0..65535 (0: off), "
                             f"got {self.metrics_port}")


@dataclass(frozen=True)
class Topology:
    """A whole validated topology: processes, connections, shared settings and run settings."""

    name: str
    path: str
    processes: tuple[ProcessSpec, ...]
    connections: tuple[ConnectionSpec, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    run: RunSettings = field(default_factory=RunSettings)
    index_name: str = "policy"
    """What the index of the topology's templates is called (``templates:``), for pictures."""
    document: dict[str, Any] = field(default_factory=dict)

    def actors_of(self, cls: type | str) -> tuple[FoundActor, ...]:
        """Every actor whose class is ``cls`` or a subclass of it (``cls`` may be given as its
        ``module:Class`` path), in the topology's order; raises an unlocated TopologyError
        when an import path names no actor class."""
        base = import_actor_class(cls) if isinstance(cls, str) else cls
        return tuple(FoundActor(actor, process) for process in self.processes
                     for actor in process.actors
                     if issubclass(import_actor_class(actor.class_path), base))


@dataclass(frozen=True)
class FoundActor:
    """An actor of the topology and the process that hosts it (:meth:`Topology.actors_of`)."""

    spec: ActorSpec
    process: ProcessSpec

    @property
    def instances(self) -> tuple[str, ...]:
        """The names of its running copies, one per replica of its process, in replica order."""
        return tuple(instance_name(self.spec.name, r, self.process.replicas)
                     for r in range(self.process.replicas))


def instance_name(name: str, replica: int, replicas: int) -> str:
    """The name of one replica: the plain name when there is one, ``name.i`` otherwise."""
    return name if replicas == 1 else f"{name}.{replica}"
