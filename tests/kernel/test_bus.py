"""Signals and slots over both transports: order, broadcast, work distribution, bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import msgspec
import pytest
import zmq

from sfbus.bus import socket_address
from sfbus.errors import TopologyError
from sfbus.frames import encode_data
from sfbus.routing import RoutingTable
from tests.kernel.bus_actors import Number
from tests.kernel.conftest import hosted, make_topology

PING_PONG = {
    "left": {"pinger": "tests.kernel.bus_actors:Pinger"},
    "right": {"ponger": "tests.kernel.bus_actors:Ponger"},
}
WIRES = [("pinger.ping", "ponger.on_ping", "broadcast"), ("ponger.pong", "pinger.on_pong",
                                                           "broadcast")]


async def test_ping_pong_in_order(transport: str) -> None:
    async with hosted(make_topology(PING_PONG, WIRES), transport) as actors:
        pinger = actors["pinger"]
        pinger.expected = 5000
        for i in range(5000):
            pinger.ping.emit(Number(i))
        await asyncio.wait_for(pinger.got_all.wait(), 10)
        assert pinger.answers == [-i for i in range(5000)]
        assert actors["ponger"]._received == 5000


async def test_async_slot_keeps_order(transport: str) -> None:
    processes = {**PING_PONG, "right": {"ponger": "tests.kernel.bus_actors:AsyncPonger"}}
    async with hosted(make_topology(processes, WIRES), transport) as actors:
        pinger = actors["pinger"]
        pinger.expected = 300
        for i in range(300):
            pinger.ping.emit(Number(i))
        await asyncio.wait_for(pinger.got_all.wait(), 10)
        assert actors["ponger"].seen == list(range(300))


async def test_failing_slot_is_contained(transport: str) -> None:
    async with hosted(make_topology(PING_PONG, WIRES), transport) as actors:
        pinger = actors["pinger"]
        pinger.expected = 2
        for value in (12, -13, 14):
            pinger.ping.emit(Number(value))
        await asyncio.wait_for(pinger.got_all.wait(), 10)
        assert pinger.answers == [-12, -14]
        assert actors["ponger"].failures == ["on_ping: unlucky"]


async def test_any_mode_round_robin_and_key(transport: str) -> None:
    topology = make_topology(PING_PONG, [("pinger.ping", "ponger.on_ping", "any"),
                                         ("ponger.pong", "pinger.on_pong", "broadcast")],
                             replicas={"right": 3})
    async with hosted(topology, transport) as actors:
        pinger = actors["pinger"]
        pinger.expected = 9
        for i in range(6):
            pinger.ping.emit(Number(i))
        for i in range(6, 9):
            pinger.ping.emit(Number(i), key=1)
        await asyncio.wait_for(pinger.got_all.wait(), 10)
        assert actors["ponger.0"].seen == [0, 3]
        assert actors["ponger.1"].seen == [1, 4, 6, 7, 8]
        assert actors["ponger.2"].seen == [2, 5]


async def test_broadcast_reaches_every_replica(transport: str) -> None:
    topology = make_topology(PING_PONG, WIRES, replicas={"right": 3})
    async with hosted(topology, transport) as actors:
        pinger = actors["pinger"]
        pinger.expected = 3
        pinger.ping.emit(Number(7))
        await asyncio.wait_for(pinger.got_all.wait(), 10)
        assert [actors[f"ponger.{i}"].seen for i in range(3)] == [[7], [7], [7]]
        assert pinger.answers == [-7, -7, -7]


async def test_local_mode_stays_in_the_senders_process(transport: str) -> None:
    pairs = {"pair": {"pinger": "tests.kernel.bus_actors:Pinger",
                      "ponger": "tests.kernel.bus_actors:Ponger"}}
    topology = make_topology(pairs, [("pinger.ping", "ponger.on_ping", "local"),
                                     ("ponger.pong", "pinger.on_pong", "local")],
                             replicas={"pair": 3})
    async with hosted(topology, transport) as actors:
        for i in range(3):
            actors[f"pinger.{i}"].expected = 2
            for value in (10 * i + 1, 10 * i + 2):
                actors[f"pinger.{i}"].ping.emit(Number(value))
        for i in range(3):
            await asyncio.wait_for(actors[f"pinger.{i}"].got_all.wait(), 10)
        assert [actors[f"ponger.{i}"].seen for i in range(3)] == [[1, 2], [11, 12], [21, 22]]
        assert [actors[f"pinger.{i}"].answers for i in range(3)] == [[-1, -2], [-11, -12],
                                                                     [-21, -22]]
        assert all(host.bus.counters.frames_sent == 0 for host in actors["_hosts"])


def test_local_mode_needs_a_target_in_the_same_process() -> None:
    topology = make_topology(PING_PONG, [("pinger.ping", "ponger.on_ping", "local")])
    with pytest.raises(TopologyError, match="mode local: pinger has no ponger in its process"):
        RoutingTable(topology)


@pytest.mark.parametrize("prompt", [False, True])
async def test_send_now_splits_answers_into_frames(prompt: bool) -> None:
    # Two pings in one frame: answered in one frame at the end of the loop iteration, or one
    # frame each when the slot sends its answer at once.
    ponger = "PromptPonger" if prompt else "Ponger"
    processes = {**PING_PONG, "right": {"ponger": f"tests.kernel.bus_actors:{ponger}"}}
    async with hosted(make_topology(processes, WIRES), "ipc") as actors:
        pinger = actors["pinger"]
        left = next(h for h in actors["_hosts"] if h.name == "left")
        pinger.expected = 2
        pinger.ping.emit(Number(1))
        pinger.ping.emit(Number(2))
        await asyncio.wait_for(pinger.got_all.wait(), 10)
        assert pinger.answers == [-1, -2]
        assert left.bus.counters.frames_sent == 1
        assert left.bus.counters.frames_received == (2 if prompt else 1)


def test_emit_checks_payload_type() -> None:
    from tests.kernel.bus_actors import Pinger

    pinger = Pinger("pinger")
    try:
        pinger.ping.emit(msgspec.Struct())  # type: ignore[arg-type]
    except TypeError as error:
        assert str(error) == "pinger.ping carries Number, got Struct"
    else:
        raise AssertionError("emit accepted the wrong payload type")


async def test_garbage_on_the_socket_is_counted_not_fatal() -> None:
    async with hosted(make_topology(PING_PONG, WIRES), "ipc") as actors:
        right = next(h for h in actors["_hosts"] if h.name == "right")
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(socket_address(right.sock_dir, "right"))
        try:
            left_id = right.table.processes["left"].index
            edge = next(iter(right.table.edges_into("right")))
            frames = [
                os.urandom(64),                                   # not msgpack at all
                msgspec.msgpack.encode([left_id, [[edge, ["x"]]]]),  # wrong payload type
                msgspec.msgpack.encode([left_id, [[999, [1]]]]),  # unknown edge
                msgspec.msgpack.encode([4242, [[edge, [1]]]]),    # unknown sender
                encode_data(left_id, [(edge, Number(99))]),       # a good one, last
            ]
            for frame in frames:
                sock.send(frame)
            pinger = actors["pinger"]
            pinger.expected = 1
            await asyncio.wait_for(pinger.got_all.wait(), 10)
        finally:
            sock.close()
        counters = right.bus.counters
        assert (counters.malformed, counters.unknown_edge, counters.unknown_peer) == (2, 1, 1)
        assert actors["ponger"].seen == [99]


async def test_coalesced_deliveries_wait_for_the_next_frame() -> None:
    # Pings on a coalescing connection wait (up to 1 s) for a frame to the same process; the
    # pongs are sent as usual. Order holds either way.
    topology = make_topology(PING_PONG, WIRES)
    lazy = dataclasses.replace(topology.connections[0], coalesce_s=1.0)
    topology = dataclasses.replace(topology, connections=(lazy, topology.connections[1]))
    async with hosted(topology, "ipc") as actors:
        pinger = actors["pinger"]
        left = next(h for h in actors["_hosts"] if h.name == "left")
        pinger.expected = 3
        for value in (1, 2, 3):
            pinger.ping.emit(Number(value))
            await asyncio.sleep(0.01)  # three loop iterations: three frames without coalescing
        assert left.bus.counters.frames_sent == 0
        await asyncio.wait_for(pinger.got_all.wait(), 10)
        assert left.bus.counters.frames_sent == 1
        assert pinger.answers == [-1, -2, -3]
