"""Hosts the actors of one or more topology processes on one event loop.

In a run, the supervisor starts ``python -m sfbus.host RUN_DIR PROCESS`` once per process; the
host builds its actors, binds its socket, reports ``Ready``, runs ``on_start`` when told
``Start``, heart-beats, and stops gracefully on ``Stop`` or SIGTERM. The same class hosts every
process of a topology on one loop for serial mode and tests.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import traceback
from collections.abc import Iterable

import zmq

from sfbus.actor import Actor
from sfbus.bus import Bus
from sfbus.context import ActorContext
from sfbus.frames import (
    ActorFailed,
    Control,
    Heartbeat,
    Ready,
    Start,
    Started,
    Stop,
    StopRequested,
    encode_control,
)
from sfbus.ratelimit import RateLimitedLog
from sfbus.records import RunRecords
from sfbus.routing import RoutingTable
from sfbus.rundir import RunLimits
from sfbus.shm import ArraySpec

log = logging.getLogger(__name__)

# Publishing counters costs a write into a metrics file per sample; once a second is plenty.
_METRICS_PERIOD_S = 1.0


class ProcessHost:
    """The actors of ``hosted`` processes, their bus, and their link to the supervisor."""

    def __init__(self, table: RoutingTable, hosted: Iterable[str], *, run_id: str,
                 run_dir: str | None = None, sock_dir: str | None = None,
                 array_specs: dict[str, ArraySpec] | None = None,
                 supervisor_address: str | None = None,
                 limits: RunLimits | None = None,
                 records: RunRecords | None = None) -> None:
        self.table = table
        self.hosted = table.stop_order(hosted)[::-1]  # built and started in this order
        self.name = self.hosted[0] if len(self.hosted) == 1 else "serial"
        self.run_id = run_id
        self.run_dir = run_dir
        self.sock_dir = sock_dir
        self.array_specs = array_specs or {}
        self.supervisor_address = supervisor_address
        self.limits = limits or RunLimits()
        self.records = records or RunRecords()
        self.progress = 0
        self.stop_requested = asyncio.Event()
        self.stop_reason = ""
        self.lost: list[str] = []
        """What the actors could not finish at stop (their ``on_stop`` raised)."""
        self.start_requested = asyncio.Event()
        self.actors: list[Actor] = []
        self.bus: Bus | None = None
        self._control: zmq.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._warn = RateLimitedLog(log)
        self._published: dict[str, int] = {}

    # ----- lifecycle ---------------------------------------------------------------------------

    async def build(self) -> None:
        """Create the actors, wire the bus and (in a run) report ``Ready`` to the supervisor."""
        self.bus = Bus(self.table, self.hosted, self.sock_dir)
        self.bus.on_control = self._on_control
        for process in self.hosted:
            instance = self.table.processes[process]
            for actor_instance in instance.actors:
                context = ActorContext(
                    run_id=self.run_id, run_dir=self.run_dir, process=process,
                    replica=instance.replica, table=self.table, array_specs=self.array_specs,
                    flush=self.bus.flush, send_now=self.bus.send_now,
                    request_stop=self.request_stop, add_progress=self.add_progress,
                    limits=self.limits, records=self.records, hosted=frozenset(self.hosted),
                )
                spec = actor_instance.spec
                actor = actor_instance.cls(actor_instance.name, spec.params, context)
                actor._failure_listeners.append(self._on_actor_failure)
                self.bus.attach(actor)
                self.actors.append(actor)
        self.bus.connect()
        self._tasks.append(asyncio.ensure_future(self.bus.serve()))
        if self.supervisor_address is not None:
            self._control = self.bus.zmq_context.socket(zmq.PUSH)
            self._control.setsockopt(zmq.LINGER, 1000)
            self._control.connect(self.supervisor_address)
            self._send(Ready(self.name, os.getpid()))
        else:
            self.start_requested.set()

    async def start(self) -> None:
        """Run every actor's ``on_start`` in topology order, then start heart-beating."""
        for actor in self.actors:
            await actor._start()
        self._send(Started(self.name))
        self._tasks.append(asyncio.ensure_future(self._heartbeat()))

    async def stop(self) -> None:
        """Stop actors in reverse order, flush what they sent, and close every socket. An
        ``on_stop`` that raises lost what it was to finish (a final checkpoint): it is told to
        the supervisor and kept in ``lost``."""
        for actor in reversed(self.actors):
            try:
                await actor._stop()
            except Exception as error:
                log.exception("%s.on_stop raised", actor.name)
                self.lost.append(f"{actor.name}.on_stop raised {type(error).__name__}: {error}")
                self._on_actor_failure(actor, "on_stop", error)
            await asyncio.sleep(0)  # what it sent to this loop's actors reaches them running
        self._publish_metrics()
        if self.bus is not None:
            try:
                await asyncio.wait_for(self.bus.flush(), timeout=2.0)
            except TimeoutError:
                log.warning("%s: frames still queued at stop were dropped", self.name)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for actor in self.actors:
            if actor.context is not None:
                actor.context.close()
        if self.bus is not None:
            self.bus.close()
        if self._control is not None:
            self._control.close()

    async def run(self) -> None:
        """Build, wait for ``Start``, run until asked to stop, then stop."""
        await self.build()
        try:
            await self.start_requested.wait()
            await self.start()
            await self.stop_requested.wait()
        finally:
            await self.stop()

    # ----- services for actors -----------------------------------------------------------------

    def request_stop(self, actor: str, reason: str) -> None:
        """An actor asked to end the run: tell the supervisor, or stop here in serial mode."""
        if self._control is None:
            self.stop_reason = reason
            self.stop_requested.set()
        else:
            self._send(StopRequested(self.name, actor, reason))

    def add_progress(self, frames: int) -> None:
        """Count progress (env frames, items...) towards the run's ``--max-frames``."""
        self.progress += frames

    # ----- plumbing ----------------------------------------------------------------------------

    def _on_control(self, message: Control) -> None:
        if isinstance(message, Start):
            self.start_requested.set()
        elif isinstance(message, Stop):
            self.stop_requested.set()

    def _on_actor_failure(self, actor: Actor, where: str, error: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        self._send(ActorFailed(self.name, actor.name, where, text))

    def _send(self, message: Control) -> None:
        if self._control is None:
            return
        try:
            self._control.send(encode_control(message), zmq.NOBLOCK)
        except zmq.Again:
            self._warn.warning("control", "%s: control channel full, dropped %s", self.name,
                               type(message).__name__)

    async def _heartbeat(self) -> None:
        interval = self.table.topology.run.heartbeat_interval_s
        ticks_per_publish = max(1, round(_METRICS_PERIOD_S / interval))
        tick = 0
        while True:
            now = time.monotonic()
            activity = {a.name: (now - a._last_activity, a._last_activity_what)
                        for a in self.actors}
            advances = {a.name: dict(a._advances) for a in self.actors if a._advances}
            self._send(Heartbeat(self.name, self.progress, activity, advances))
            if tick % ticks_per_publish == 0:
                self._publish_metrics()
            tick += 1
            await asyncio.sleep(interval)

    def _publish_metrics(self) -> None:
        """Move the bus's plain-int counters into Prometheus counters as increments."""
        from sfbus import metrics

        if self.bus is None:
            return
        sent = metrics.counter("sfbus_bus_signals_sent_total", "Signals emitted", ("actor",))
        received = metrics.counter("sfbus_bus_signals_received_total", "Signals delivered to slots",
                                   ("actor",))
        for actor in self.actors:
            emitted = sum(b.emitted for b in actor._bound_signals.values())
            self._bump(sent.labels(actor.name), f"sent:{actor.name}", emitted)
            self._bump(received.labels(actor.name), f"received:{actor.name}", actor._received)
        occupancy = metrics.gauge("sfbus_slot_pool_slots_in_use", "Slots taken from a pool",
                                  ("pool",), "mostrecent")
        for actor in self.actors:
            for pool in actor.context.pools if actor.context is not None else ():
                occupancy.labels(pool.name).set(pool.in_use)
        counters = self.bus.counters
        for field in ("frames_received", "frames_sent", "malformed", "unknown_edge",
                      "unknown_peer"):
            metric = metrics.counter(f"sfbus_bus_{field}_total",
                                     f"Data frames: {field.replace('_', ' ')}", ("process",))
            self._bump(metric.labels(self.name), field, getattr(counters, field))

    def _bump(self, child: object, key: str, total: int) -> None:
        delta = total - self._published.get(key, 0)
        if delta:
            child.inc(delta)  # type: ignore[attr-defined]
            self._published[key] = total
