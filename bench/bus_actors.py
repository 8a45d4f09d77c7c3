"""The sfbus side of ``bench/bus.py``: its actors, and the topologies that wire them.

The actors are a flooding sender, a counting receiver, and a ping-pong pair. Each pair exchanges a
greeting both ways (or warms up) before the timed part, so that process start-up and ZeroMQ's
reconnection delay stay out of the figures (``bench/bus.py`` reports the whole wall time apart).
The topologies are run by the real ``sfbus run``; the actors write their results as JSON into the
run directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sfbus import Actor, Empty, Message, Signal, slot

ROOT = Path(__file__).resolve().parent.parent


class Index(Message, frozen=True):
    """A small index message: one (slot, t) pair, as a rollout worker would send."""

    slot: int
    t: int


class IndexBatch(Message, frozen=True):
    """A batched index message: many indices in one record."""

    indices: tuple[int, ...]


def _write(actor: Actor, name: str, result: dict[str, Any]) -> None:
    assert actor.context is not None and actor.context.run_dir is not None
    Path(actor.context.run_dir, name).write_text(json.dumps(result))


class FloodSender(Actor):
    """Emits ``count`` messages as fast as the bus takes them, yielding every ``burst``."""

    @dataclass(frozen=True)
    class Params:
        count: int = 1_000_000
        """Messages to send."""
        burst: int = 8192
        """Messages emitted between two ``await flush()`` (how often the sender yields)."""
        batch: int = 0
        """0: send ``Index``; n > 0: send ``IndexBatch`` of n indices."""

    sender_started = Signal(Empty)
    index_sent = Signal(Index)
    batch_sent = Signal(IndexBatch)

    async def on_start(self) -> None:
        """Greet the receiver, which answers once this link to it carries messages."""
        self.sender_started.emit()

    @slot
    def on_receiver_started(self, msg: Empty) -> None:
        """The receiver is up: start the flood in an owned task."""
        self.spawn(self._flood(), "flood")

    async def _flood(self) -> None:
        count, burst, batch = self.params.count, self.params.burst, self.params.batch
        started = time.monotonic()
        if batch:
            emit_batch, indices = self.batch_sent.emit, tuple(range(batch))
            for i in range(count):
                emit_batch(IndexBatch(indices))
                if i % burst == burst - 1:
                    await self.flush()
        else:
            emit = self.index_sent.emit
            for i in range(count):
                emit(Index(i, 7))
                if i % burst == burst - 1:
                    await self.flush()
        await self.flush()
        _write(self, "sender.json", {"first_send": started, "last_send": time.monotonic()})


class FloodReceiver(Actor):
    """Counts arrivals; writes first/last receive times and ends the run after ``count``."""

    @dataclass(frozen=True)
    class Params:
        count: int = 1_000_000
        """Messages expected."""

    receiver_started = Signal(Empty)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.n = 0
        self.first = 0.0

    @slot
    def on_sender_started(self, msg: Empty) -> None:
        """The sender's greeting arrived, so its link works both ways: tell it to begin."""
        self.receiver_started.emit()

    @slot
    def on_index_sent(self, msg: Index) -> None:
        """Count one small message."""
        self.n += 1
        if self.n == 1:
            self.first = time.monotonic()
        elif self.n == self.params.count:
            self._done(msg.slot)

    @slot
    def on_batch_sent(self, msg: IndexBatch) -> None:
        """Count one batched message."""
        self.n += 1
        if self.n == 1:
            self.first = time.monotonic()
        elif self.n == self.params.count:
            self._done(len(msg.indices))

    def _done(self, last: int) -> None:
        _write(self, "receiver.json", {"received": self.n, "first": self.first,
                                       "last": time.monotonic(), "last_value": last})
        self.stop_run("flood received")


class Pinger(Actor):
    """Sends one ping at a time and times each round trip to the ponger and back."""

    @dataclass(frozen=True)
    class Params:
        rounds: int = 20_000
        """Round trips timed."""
        warmup: int = 1_000
        """Round trips run first and not timed."""

    ping_sent = Signal(Index)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.samples: list[int] = []
        self.seq = 0
        self.sent_at = 0

    @slot
    def on_ponger_started(self, msg: Empty) -> None:
        """The ponger is up: send the first ping."""
        self._ping()

    @slot
    def on_pong_sent(self, msg: Index) -> None:
        """Time the round trip, then ping again or finish."""
        elapsed = time.perf_counter_ns() - self.sent_at
        if msg.slot != self.seq:
            raise ValueError(f"pong {msg.slot} answers no ping (expected {self.seq})")
        if self.seq >= self.params.warmup:
            self.samples.append(elapsed)
        self.seq += 1
        if self.seq < self.params.warmup + self.params.rounds:
            self._ping()
        else:
            _write(self, "pinger.json", {"samples_ns": self.samples})
            self.stop_run("round trips done")

    def _ping(self) -> None:
        self.sent_at = time.perf_counter_ns()
        self.ping_sent.emit(Index(self.seq, 0))


class Ponger(Actor):
    """Answers every ping with a pong carrying the same index."""

    ponger_started = Signal(Empty)
    pong_sent = Signal(Index)

    async def on_start(self) -> None:
        """Tell the pinger to begin."""
        self.ponger_started.emit()

    @slot
    def on_ping_sent(self, msg: Index) -> None:
        """Answer at once."""
        self.pong_sent.emit(msg)


# ----- topologies wiring the actors above, run by the real CLI ----------------------------

FLOOD = """name: bench-flood
settings: {count: %(count)d, burst: %(burst)d, batch: %(batch)d}
processes:
  sender: {restart: never, actors: {sender: {class: %(mod)s:FloodSender}}}
  receiver: {restart: never, actors: {receiver: {class: %(mod)s:FloodReceiver}}}
connections:
  - {from: sender.sender_started, to: receiver.on_sender_started}
  - {from: receiver.receiver_started, to: sender.on_receiver_started}
  - {from: sender.%(signal)s, to: receiver.on_%(signal)s}
"""

PINGPONG = """name: bench-pingpong
settings: {rounds: %(rounds)d}
processes:
  pinger: {restart: never, actors: {pinger: {class: %(mod)s:Pinger}}}
  ponger: {restart: never, actors: {ponger: {class: %(mod)s:Ponger}}}
connections:
  - {from: ponger.ponger_started, to: pinger.on_ponger_started}
  - {from: pinger.ping_sent, to: ponger.on_ping_sent}
  - {from: ponger.pong_sent, to: pinger.on_pong_sent}
"""


def sfbus_run(topology: str, outputs: list[str]) -> tuple[float, list[dict[str, Any]]]:
    """Run a topology with ``sfbus run`` in a temp dir; the wall time and the actors' JSON."""
    with tempfile.TemporaryDirectory(prefix="sfbus-bench-") as tmp:
        path = Path(tmp, "bench.yaml")
        path.write_text(topology)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "sfbus", "run", str(path), "--run-dir", str(Path(tmp, "run")),
             "--max-seconds", "300"], cwd=ROOT, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        try:
            return wall, [json.loads(Path(tmp, "run", o).read_text()) for o in outputs]
        except FileNotFoundError:
            tail = done.stderr[-3000:]
            raise SystemExit(f"sfbus run failed ({done.returncode}):\n{tail}") from None


def sfbus_flood(count: int, batch: int, burst: int) -> tuple[float, float, float]:
    """Flood ``count`` messages one way; seconds from first to last receive, from first send, wall.

    ``batch`` 0 sends ``Index``, else ``IndexBatch`` of that many indices; the sender awaits
    ``flush()`` every ``burst`` emits.
    """
    signal = "batch_sent" if batch else "index_sent"
    wall, (recv, send) = sfbus_run(FLOOD % dict(count=count, burst=burst, batch=batch,
                                                mod=__name__, signal=signal),
                                   ["receiver.json", "sender.json"])
    assert recv["received"] == count and recv["last_value"] == (batch or count - 1), recv
    return recv["last"] - recv["first"], recv["last"] - send["first_send"], wall


def sfbus_pingpong(rounds: int) -> list[int]:
    """Time ``rounds`` round trips of one small message through the bus and back (ns each)."""
    _, (ping,) = sfbus_run(PINGPONG % dict(rounds=rounds, mod=__name__), ["pinger.json"])
    return ping["samples_ns"]
