"""A producer writes numbers into shared slots; a consumer sums them exactly once.

Only slot indices travel on the bus. Both actors keep their state in shared memory, so either
process can be killed at any moment and, once the supervisor restarts it, the run still ends with
the exact total: the producer re-sends every slot still taken, the consumer records each item by
index (an idempotent write) and acknowledges, and stale messages are recognised by item number.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sfbus import Actor, ArraySpec, Message, RunRecords, Signal, SlotPool, slot
from sfbus.topology import Topology

_NO_ITEM = -1


def item_value(item: int) -> int:
    """The number produced for item ``item`` (not just ``item``, so a mix-up changes the sum)."""
    return 3 * item + 1


def expected_total(count: int) -> int:
    """The sum a correct run of ``count`` items reports."""
    return sum(item_value(i) for i in range(count))


class SlotItem(Message, frozen=True):
    """Item ``item`` is in slot ``slot`` of the producer's buffer."""

    slot: int
    item: int


class Producer(Actor):
    """Fills free slots with items and re-sends those not acknowledged within ``resend_s``."""

    @dataclass(frozen=True)
    class Params:
        count: int = 10_000
        """Items to produce in all."""
        slots: int = 64
        """Slots in the shared buffer (items in flight at most)."""
        resend_s: float = 1.0
        """Re-send an unacknowledged slot after this long (covers a restarted consumer)."""

    item_ready = Signal(SlotItem)

    @classmethod
    def shared_arrays(cls, name: str, params: Params, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """The slot pool, the slots' values and item numbers, and the next item to produce."""
        return [
            *SlotPool.array_specs(f"{name}.pool", params.slots),
            ArraySpec(f"{name}.values", (params.slots,), "int64"),
            ArraySpec(f"{name}.items", (params.slots,), "int64"),
            ArraySpec(f"{name}.next", (1,), "int64"),
        ]

    async def on_start(self) -> None:
        """Recover from shared memory, re-send what is in flight, start producing."""
        ctx = self.context
        self.values = ctx.shared(f"{self.name}.values").numpy
        self.items = ctx.shared(f"{self.name}.items").numpy
        self.next = ctx.shared(f"{self.name}.next").numpy
        self.pool = ctx.slot_pool(f"{self.name}.pool", owner=self.name, actor=self.name)
        self.sent_at: dict[int, float] = {}
        for taken in self.pool.taken():
            if self.items[taken] == _NO_ITEM:  # killed between acquire and write: never sent
                self.pool.release(taken)
            else:
                self._send(taken)
        self._produce()
        self.every(self.params.resend_s, self._resend_stale)

    @slot
    def on_item_consumed(self, msg: SlotItem) -> None:
        """The consumer recorded ``msg.item``: free its slot (unless the ack is stale)."""
        if self.items[msg.slot] != msg.item:
            return
        self.items[msg.slot] = _NO_ITEM
        self.sent_at.pop(msg.slot, None)
        self.pool.release(msg.slot)
        self._produce()

    def _produce(self) -> None:
        count = self.params.count
        while self.next[0] < count and self.pool.free:
            taken = self.pool.acquire()
            item = int(self.next[0])
            self.values[taken] = item_value(item)
            self.items[taken] = item
            self.next[0] = item + 1
            self.report_progress(1)
            self._send(taken)

    def _send(self, taken: int) -> None:
        self.sent_at[taken] = time.monotonic()
        self.item_ready.emit(SlotItem(taken, int(self.items[taken])))

    def _resend_stale(self) -> None:
        deadline = time.monotonic() - self.params.resend_s
        for taken, sent in list(self.sent_at.items()):
            if sent < deadline:
                self._send(taken)


class Consumer(Actor):
    """Records each item's value once, acknowledges it, and ends the run when all arrived."""

    @dataclass(frozen=True)
    class Params:
        count: int = 10_000
        """Items to wait for (the producer's count)."""
        producer: str = "producer"
        """Name of the producer actor whose buffer the slots index."""

    item_consumed = Signal(SlotItem)

    @classmethod
    def shared_arrays(cls, name: str, params: Params, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """Per item: its recorded value and whether it arrived."""
        return [
            ArraySpec(f"{name}.received", (params.count,), "int64"),
            ArraySpec(f"{name}.done", (params.count,), "uint8"),
        ]

    async def on_start(self) -> None:
        """Attach the producer's buffer and our own records (which survive a restart)."""
        ctx = self.context
        self.values = ctx.shared(f"{self.params.producer}.values").numpy
        self.items = ctx.shared(f"{self.params.producer}.items").numpy
        self.received = ctx.shared(f"{self.name}.received").numpy
        self.done = ctx.shared(f"{self.name}.done").numpy
        self.done_count = int(np.count_nonzero(self.done))
        self.finished = False
        self._finish_if_complete()

    @slot
    def on_item_ready(self, msg: SlotItem) -> None:
        """Record the item (idempotently) and acknowledge it."""
        if self.items[msg.slot] != msg.item:  # a re-send that lost the race with its own ack
            return
        if not self.done[msg.item]:
            self.received[msg.item] = self.values[msg.slot]
            self.done[msg.item] = 1
            self.done_count += 1
        self.item_consumed.emit(msg)
        self._finish_if_complete()

    def _finish_if_complete(self) -> None:
        if self.finished or self.done_count < self.params.count:
            return
        self.finished = True
        total = int(self.received.sum())
        if self.context.run_dir is not None:
            result = {"items": self.done_count, "total": total}
            Path(self.context.run_dir, "sum_result.json").write_text(json.dumps(result))
        self.log.info("summed %d items: total %d", self.done_count, total)
        self.stop_run(f"summed {self.done_count} items")
