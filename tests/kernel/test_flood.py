"""A flood of 10^6 index messages to an actor in another process: all arrive once, in order.

The actors are defined here, in a test module, and wired by import path exactly like built-in
components (``tests.kernel.test_flood:FloodSender``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sfbus import Actor, Message, Signal, slot

pytestmark = pytest.mark.multiprocess


class Index(Message, frozen=True):
    """One small index message."""

    seq: int


class FloodSender(Actor):
    """Emits ``count`` indices as fast as the bus takes them."""

    @dataclass(frozen=True)
    class Params:
        count: int = 1_000_000

    sent = Signal(Index)

    async def on_start(self) -> None:
        """Start flooding in an owned task."""
        self.spawn(self._flood(), "flood")

    async def _flood(self) -> None:
        emit = self.sent.emit
        for seq in range(self.params.count):
            emit(Index(seq))
            if seq % 8192 == 8191:  # back-pressure: let the frames reach ZeroMQ
                await self.flush()
        await self.flush()


class FloodReceiver(Actor):
    """Checks that indices arrive once and in order; ends the run after the last."""

    @dataclass(frozen=True)
    class Params:
        count: int = 1_000_000

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.next_seq = 0
        self.out_of_order = 0

    @slot
    def on_sent(self, msg: Index) -> None:
        """Count one index."""
        if msg.seq != self.next_seq:
            self.out_of_order += 1
        self.next_seq = msg.seq + 1
        self.report_progress(1)
        if msg.seq == self.params.count - 1:
            result = {"received": self._received, "out_of_order": self.out_of_order}
            Path(self.context.run_dir, "flood.json").write_text(json.dumps(result))
            self.stop_run("flood received")


TOPOLOGY = """
settings: {count: %d}
processes:
  sender: {restart: never, actors: {sender: {class: tests.kernel.test_flood:FloodSender}}}
  receiver: {restart: never, actors: {receiver: {class: tests.kernel.test_flood:FloodReceiver}}}
connections:
  - {from: sender.sent, to: receiver.on_sent}
"""


def test_flood_of_a_million_arrives_once_in_order(tmp_path: Path) -> None:
    count = 1_000_000
    topology = tmp_path / "flood.yaml"
    topology.write_text(TOPOLOGY % count)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(topology), "--run-dir", str(run_dir),
         "--max-seconds", "90"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "flood received" in done.stderr
    result = json.loads((run_dir / "flood.json").read_text())
    assert result == {"received": count, "out_of_order": 0}
