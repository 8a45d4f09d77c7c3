"""Actors the bus tests wire together in-process and over ipc."""

from __future__ import annotations

import asyncio

from sfbus import Actor, Message, Signal, slot


class Number(Message, frozen=True):
    """An integer travelling on the bus."""

    value: int


class Pinger(Actor):
    """Emits numbers on request and records the answers."""

    ping = Signal(Number)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.answers: list[int] = []
        self.got_all = asyncio.Event()
        self.expected = 0

    @slot
    def on_pong(self, msg: Number) -> None:
        """Record an answer."""
        self.answers.append(msg.value)
        if len(self.answers) >= self.expected:
            self.got_all.set()


class Ponger(Actor):
    """Answers every ping with the same number, negated; a negative ping raises."""

    pong = Signal(Number)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[int] = []
        self.failures: list[str] = []

    @slot
    def on_ping(self, msg: Number) -> None:
        """Answer, or raise on a negative number to test that failures are contained."""
        if msg.value < 0:
            raise ValueError("unlucky")
        self.seen.append(msg.value)
        self.pong.emit(Number(-msg.value))

    def on_failure(self, where: str, error: BaseException) -> None:
        """Remember failures for the test."""
        self.failures.append(f"{where}: {error}")


class AsyncPonger(Ponger):
    """Answers from an async slot that yields in between (order must hold)."""

    @slot
    async def on_ping(self, msg: Number) -> None:
        """Answer after yielding to the loop."""
        await asyncio.sleep(0)
        self.seen.append(msg.value)
        self.pong.emit(Number(-msg.value))


class PromptPonger(Ponger):
    """Answers each ping and sends the answer at once, before its next slot runs."""

    @slot
    def on_ping(self, msg: Number) -> None:
        """Answer and hand the answer to the wire now."""
        super().on_ping(msg)
        self.send_now()
