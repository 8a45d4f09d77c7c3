"""Actors on one loop (serial mode) stop senders first: what an actor sends from its ``on_stop``
(a rollout worker's last progress) still reaches a receiver in another process (statistics),
whatever the processes' names."""

from __future__ import annotations

import asyncio

from sfbus import Actor, Signal, slot
from sfbus.routing import RoutingTable
from tests.kernel.bus_actors import Number
from tests.kernel.conftest import hosted, make_topology


class LastWord(Actor):
    """Says one number as it stops."""

    said = Signal(Number)

    async def on_stop(self) -> None:
        """Report the last progress."""
        self.said.emit(Number(7))


class Listener(Actor):
    """Keeps what it hears."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.heard: list[int] = []

    @slot
    def on_said(self, msg: Number) -> None:
        """Keep a number."""
        self.heard.append(msg.value)


# the sender's process sorts first by name: stopping by name alone, last first, stopped the
# listener before the sender spoke
SPEAKER_TO_LISTENER = make_topology(
    {"a_speaker": {"speaker": "tests.kernel.test_stop_order:LastWord"},
     "z_listener": {"listener": "tests.kernel.test_stop_order:Listener"}},
    [("speaker.said", "listener.on_said", "broadcast")])


async def test_a_stopping_actors_last_message_reaches_a_listener_on_the_same_loop() -> None:
    async with hosted(SPEAKER_TO_LISTENER, "inproc") as actors:
        listener = actors["listener"]
    await asyncio.sleep(0)
    assert listener.heard == [7]


def test_senders_stop_before_what_they_reach_and_a_cycle_by_name() -> None:
    topology = make_topology(
        {"learner": {"learner": "tests.kernel.bus_actors:Ponger"},
         "rollout": {"rollout": "tests.kernel.bus_actors:Pinger"},
         "a_stats": {"stats": "tests.kernel.test_stop_order:Listener"},
         "b_alone": {"alone": "tests.kernel.test_stop_order:Listener"}},
        [("rollout.ping", "learner.on_ping", "broadcast"),
         ("learner.pong", "rollout.on_pong", "broadcast"),
         ("learner.pong", "stats.on_said", "broadcast")])
    table = RoutingTable(topology)
    assert table.stop_order(table.processes) == ["rollout", "learner", "b_alone", "a_stats"]
