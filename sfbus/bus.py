"""The bus of one process: delivers signals to local slots directly and to other processes over ipc.

Inside the process an emission becomes ``loop.call_soon(slot, payload)``. Towards another process
it is appended to that peer's outbox; the outbox is encoded as one data frame (see
:mod:`sfbus.frames`) at the end of the loop iteration, or as soon as it is full, and sent with a
non-blocking send on a ZeroMQ PUSH socket (an actor's ``send_now`` sends it at once; a
connection's ``coalesce_s`` lets its deliveries wait that long for the next frame). Each process
binds one PULL socket; its receive loop awaits readiness and then drains with non-blocking
receives, which is what keeps a flood from stalling the socket's edge-triggered notification.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from sfbus.actor import Actor
from sfbus.errors import FrameError
from sfbus.frames import (
    CONTROL_EDGE,
    MAX_DELIVERIES_PER_FRAME,
    SUPERVISOR_SENDER,
    Control,
    PayloadDecoder,
    decode_control,
    decode_data,
    encode_data,
)
from sfbus.messages import Message
from sfbus.ratelimit import RateLimitedLog
from sfbus.routing import Edge, Route, RoutingTable

log = logging.getLogger(__name__)

# Deliveries handled per wake-up before yielding to the loop, so that a flood cannot starve
# timers and heartbeats (a frame holds up to MAX_DELIVERIES_PER_FRAME of them).
_DRAIN_BUDGET = 8192


def socket_address(sock_dir: str, process: str) -> str:
    """The ipc address a process binds its data socket to."""
    return f"ipc://{os.path.join(sock_dir, process)}.ipc"


@dataclass
class BusCounters:
    """Per-process counts of what went wrong on the wire (exported as metrics)."""

    frames_received: int = 0
    frames_sent: int = 0
    malformed: int = 0
    unknown_edge: int = 0
    unknown_peer: int = 0


class _Peer:
    """Outgoing link to one other process: an outbox coalesced into frames, sent unblocked."""

    def __init__(self, bus: Bus, address: str) -> None:
        self.bus = bus
        self.sock = bus.zmq_context.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        # A peer that is not bound yet (starting, restarting) is retried every 100 ms by
        # default; 10 ms keeps the first frames after a (re)start from waiting that long.
        self.sock.setsockopt(zmq.RECONNECT_IVL, 10)
        self.sock.connect(address)
        self.outbox: list[tuple[int, Message]] = []
        self.pending: deque[bytes] = deque()
        self.scheduled = False
        self.timer: asyncio.TimerHandle | None = None
        self.writer: asyncio.Task[None] | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    def append(self, edge_id: int, payload: Message) -> None:
        self.outbox.append((edge_id, payload))
        if len(self.outbox) >= MAX_DELIVERIES_PER_FRAME:
            self.flush()
        elif not self.scheduled:
            self.scheduled = True
            self.idle.clear()
            self.bus.loop.call_soon(self.flush)

    def append_later(self, edge_id: int, payload: Message, delay: float) -> None:
        """Queue a delivery that may wait up to ``delay`` s for the next frame to this peer."""
        self.outbox.append((edge_id, payload))
        if len(self.outbox) >= MAX_DELIVERIES_PER_FRAME:
            self.flush()
        elif not self.scheduled and self.timer is None:
            self.idle.clear()
            self.timer = self.bus.loop.call_later(delay, self.flush)

    def flush(self) -> None:
        self.scheduled = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.outbox:
            frame = encode_data(self.bus.sender_id, self.outbox)
            self.outbox = []
            self.bus.counters.frames_sent += 1
            if self.pending:
                self.pending.append(frame)
            else:
                try:
                    self.sock.send(frame, zmq.NOBLOCK)
                except zmq.Again:  # peer's queue is full: keep order, wait for room
                    self.pending.append(frame)
        if self.pending:
            self.idle.clear()
            if self.writer is None:
                self.writer = asyncio.ensure_future(self._write_pending())
        elif not self.scheduled:
            self.idle.set()

    async def _write_pending(self) -> None:
        poller = zmq.asyncio.Socket.from_socket(self.sock)
        try:
            while self.pending:
                await poller.poll(flags=zmq.POLLOUT)
                while self.pending:
                    try:
                        self.sock.send(self.pending[0], zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.pending.popleft()
        finally:
            self.writer = None
            if not self.pending and not self.scheduled:
                self.idle.set()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.writer is not None:
            self.writer.cancel()
        self.sock.close(linger=0)


class Bus:
    """Moves the signals of the actors hosted by one OS process.

    ``hosted`` names the topology process instances whose actors live here: one in a normal
    run, all of them in serial mode (every actor on one loop, no sockets at all).
    """

    def __init__(self, table: RoutingTable, hosted: Iterable[str], sock_dir: str | None = None,
                 zmq_context: zmq.Context | None = None) -> None:
        self.table = table
        self.hosted = set(hosted)
        self.sock_dir = sock_dir
        self.loop = asyncio.get_running_loop()
        self.zmq_context = zmq_context or zmq.Context.instance()
        self.counters = BusCounters()
        self.actors: dict[str, Actor] = {}
        self.on_control: Callable[[Control], None] = lambda message: None
        self._warn = RateLimitedLog(log)
        self._peers: dict[str, _Peer] = {}
        self._inbound: dict[int, tuple[PayloadDecoder, Callable[[Message], None]]] = {}
        self._allowed_senders: set[int] = {SUPERVISOR_SENDER}
        self._receiver: zmq.Socket | None = None
        first = next(iter(sorted(self.hosted)))
        self.sender_id = table.processes[first].index

    def attach(self, actor: Actor) -> None:
        """Host ``actor``; its name must be an actor instance of a hosted process."""
        instance = self.table.actors[actor.name]
        if instance.process not in self.hosted:
            raise ValueError(f"actor {actor.name!r} belongs to process {instance.process!r}")
        self.actors[actor.name] = actor

    def connect(self) -> None:
        """Wire every hosted actor's signals to their routes and bind the data socket."""
        for name, actor in self.actors.items():
            for route in self.table.routes.get(name, ()):
                bound = actor._bound_signals[route.signal]
                bound.routes = (*bound.routes, self._route_function(route))
        remote_sources = any(
            self.table.actors[e.source].process not in self.hosted
            for process in self.hosted for e in self.table.edges_into(process).values()
        )
        for process in self.hosted:
            for edge_id, edge in self.table.edges_into(process).items():
                target = self.actors[edge.target]
                self._inbound[edge_id] = (PayloadDecoder(edge.payload),
                                          target._bind_slot(edge.slot))
            self._allowed_senders |= self.table.senders_to(process)
        if self.sock_dir is not None and (remote_sources or len(self.hosted) == 1):
            self._receiver = self.zmq_context.socket(zmq.PULL)
            self._receiver.setsockopt(zmq.LINGER, 0)
            self._receiver.bind(socket_address(self.sock_dir, first_of(self.hosted)))

    def _route_function(self, route: Route) -> Callable[[Message, int | None], None]:
        deliver = [self._edge_function(edge) for edge in route.edges]
        if route.mode != "any" or len(deliver) == 1:
            if len(deliver) == 1:
                only = deliver[0]
                return lambda payload, key: only(payload)

            def broadcast(payload: Message, key: int | None) -> None:
                for fn in deliver:
                    fn(payload)
            return broadcast

        turn = itertools.cycle(range(len(deliver)))

        def any_one(payload: Message, key: int | None) -> None:
            deliver[next(turn) if key is None else key % len(deliver)](payload)
        return any_one

    def _edge_function(self, edge: Edge) -> Callable[[Message], None]:
        if edge.process in self.hosted:
            call_soon = self.loop.call_soon
            target = self.actors[edge.target]._bind_slot(edge.slot)
            return lambda payload: call_soon(target, payload)
        if self.sock_dir is None:
            raise ValueError(f"edge to {edge.process!r} needs a socket directory")
        peer = self._peers.get(edge.process)
        if peer is None:
            address = socket_address(self.sock_dir, edge.process)
            peer = self._peers[edge.process] = _Peer(self, address)
        edge_id = edge.id
        if edge.coalesce_s > 0:
            append_later, delay = peer.append_later, edge.coalesce_s
            return lambda payload: append_later(edge_id, payload, delay)
        append = peer.append
        return lambda payload: append(edge_id, payload)

    async def serve(self) -> None:
        """Receive frames until cancelled; malformed input is counted and logged, never raised.

        A ZeroMQ socket's file descriptor is edge-triggered: it signals once when messages
        arrive, and only re-arms after a receive came back empty. So the reader callback drains
        with non-blocking receives until ``zmq.Again`` (yielding to the loop every
        ``_DRAIN_BUDGET`` deliveries so a flood cannot starve timers), then checks ``EVENTS``
        once more.
        """
        if self._receiver is None:
            await asyncio.Event().wait()
            return
        fd = self._receiver.getsockopt(zmq.FD)
        self.loop.add_reader(fd, self._drain)
        try:
            self._drain()
            await asyncio.Event().wait()
        finally:
            self.loop.remove_reader(fd)

    def _drain(self) -> None:
        receiver = self._receiver
        if receiver is None:
            return
        budget = _DRAIN_BUDGET
        while budget > 0:
            try:
                frame = receiver.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            budget -= self.dispatch(frame)
        else:
            self.loop.call_soon(self._drain)
            return
        if receiver.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.loop.call_soon(self._drain)

    def dispatch(self, frame: bytes) -> int:
        """Decode one data frame and deliver its payloads; bad parts are dropped and counted.

        Returns the number of deliveries the frame held (the receive loop's work budget).
        """
        self.counters.frames_received += 1
        try:
            sender, deliveries = decode_data(frame)
        except FrameError as error:
            self.counters.malformed += 1
            self._warn.warning("malformed", "dropped a malformed frame: %s", error)
            return 1
        if sender not in self._allowed_senders:
            self.counters.unknown_peer += 1
            self._warn.warning("peer", "dropped a frame from unknown sender id %s", sender)
            return 1
        inbound = self._inbound
        for edge_id, raw in deliveries:
            entry = inbound.get(edge_id)
            try:
                if entry is None:
                    if sender == SUPERVISOR_SENDER and edge_id == CONTROL_EDGE:
                        self.on_control(decode_control(raw))
                        continue
                    self.counters.unknown_edge += 1
                    self._warn.warning("edge", "dropped a delivery on unknown edge %s", edge_id)
                    continue
                payload = entry[0].decode(raw)
            except FrameError as error:
                self.counters.malformed += 1
                self._warn.warning("payload", "dropped a malformed payload: %s", error)
                continue
            entry[1](payload)
        return len(deliveries)

    def send_now(self) -> None:
        """Encode and send every outbox now instead of at the end of the loop iteration."""
        for peer in self._peers.values():
            if peer.scheduled:
                peer.flush()

    async def flush(self) -> None:
        """Wait until every queued outgoing frame was handed to ZeroMQ.

        Always yields to the loop at least once, so a sender that floods and flushes in a loop
        still lets its own slots (and the supervisor's ``Stop``) run.
        """
        await asyncio.sleep(0)
        for peer in list(self._peers.values()):
            await peer.idle.wait()

    def close(self) -> None:
        """Close every socket (pending frames are dropped)."""
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()
        if self._receiver is not None:
            self._receiver.close(linger=0)
            self._receiver = None


def first_of(names: Iterable[str]) -> str:
    """The first name in sorted order (the wire identity of a bus hosting several processes)."""
    return sorted(names)[0]
