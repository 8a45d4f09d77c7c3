"""The actor base class: introspection, hooks, timers, failures, messages held until start."""

from __future__ import annotations

import asyncio

import pytest

from sfbus import Actor, Empty, Message, Signal, slot
from tests.kernel.bus_actors import Number, Ponger


class Tick(Message, frozen=True):
    n: int


class Clock(Actor):
    """Counts timer ticks; its timer raises once."""

    ticked = Signal(Tick)
    stopped = Signal()

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.ticks = 0
        self.failures: list[str] = []
        self.enough = asyncio.Event()

    async def on_start(self) -> None:
        self.every(0.01, self._tick)

    def _tick(self) -> None:
        self.ticks += 1
        if self.ticks == 2:
            raise RuntimeError("second tick")
        if self.ticks >= 4:
            self.enough.set()

    def on_failure(self, where: str, error: BaseException) -> None:
        self.failures.append(f"{where}: {error}")

    @slot
    def on_tick(self, msg: Tick) -> None:
        """Nothing."""


def test_introspection() -> None:
    assert Clock.signal_types() == {"ticked": Tick, "stopped": Empty}
    assert Clock.slot_types() == {"on_tick": Tick}
    assert Ponger.slot_types() == {"on_ping": Number}


def test_a_slot_without_a_message_annotation_is_refused() -> None:
    class Bad(Actor):
        @slot
        def on_x(self, msg: int) -> None:
            """Wrong."""

    with pytest.raises(TypeError, match=r"annotate its parameter with a sfbus\.Message subclass"):
        Bad.slot_types()


async def test_timer_keeps_ticking_after_a_failure_and_stops_with_the_actor() -> None:
    clock = Clock("clock")
    await clock._start()
    await asyncio.wait_for(clock.enough.wait(), 5)
    await clock._stop()
    ticks = clock.ticks
    await asyncio.sleep(0.05)
    assert clock.ticks == ticks
    assert clock.failures == ["timer _tick: second tick"]


async def test_messages_before_start_wait_for_on_start() -> None:
    ponger = Ponger("ponger")
    deliver = ponger._bind_slot("on_ping")
    deliver(Number(1))
    assert ponger.seen == []
    await ponger._start()
    assert ponger.seen == [1]
    await ponger._stop()


async def test_last_activity_follows_slots_and_timers_not_only_on_start() -> None:
    # The heartbeat reports (age, what) of each actor's last activity; a hung actor is named
    # by the slot or timer it was in.
    clock = Clock("clock")
    await clock._start()
    assert clock._last_activity_what == "on_start"
    await asyncio.wait_for(clock.enough.wait(), 5)
    assert clock._last_activity_what == "timer _tick"
    before = clock._last_activity
    clock._bind_slot("on_tick")(Tick(1))
    assert clock._last_activity_what == "on_tick" and clock._last_activity >= before
    await clock._stop()


class Mailbox(Actor):
    """Keeps what its async slot gets."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.got: list[int] = []
        self.failures: list[str] = []

    @slot
    async def on_number(self, msg: Number) -> None:
        """Keep a number."""
        self.got.append(msg.value)

    def on_failure(self, where: str, error: BaseException) -> None:
        self.failures.append(f"{where}: {error}")


@pytest.mark.parametrize("before", [[], [1]])
async def test_a_message_to_an_async_slot_after_the_stop_is_dropped(before: list[int]) -> None:
    # a peer's late frame (it stopped after this actor) must not run the slot of a stopped
    # actor, whether or not its mailbox was in use before
    actor = Mailbox("mailbox")
    deliver = actor._bind_slot("on_number")
    await actor._start()
    for value in before:
        deliver(Number(value))
    await asyncio.sleep(0.01)
    await actor._stop()
    deliver(Number(2))
    await asyncio.sleep(0.01)
    assert actor.got == before and actor.failures == [] and not actor._tasks
