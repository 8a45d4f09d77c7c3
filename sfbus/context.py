"""What an actor can reach of its run: names, shared memory, the bus, the supervisor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sfbus.records import RunRecords
from sfbus.rundir import RunLimits
from sfbus.shm import ArraySpec, SharedArray, SharedMemory
from sfbus.slot_pool import SlotPool

if TYPE_CHECKING:
    from sfbus.routing import RoutingTable


@dataclass
class ActorContext:
    """Run-wide facts and services handed to every actor of one process."""

    run_id: str
    run_dir: str | None
    process: str
    replica: int
    table: RoutingTable
    array_specs: dict[str, ArraySpec]
    flush: Callable[[], Awaitable[None]]
    send_now: Callable[[], None]
    request_stop: Callable[[str, str], None]
    add_progress: Callable[[int], None]
    limits: RunLimits = field(default_factory=RunLimits)
    """The run's stop conditions, for actors that show progress towards them."""
    records: RunRecords = field(default_factory=RunRecords)
    """The run records computed at launch (``records[DataPath]``), the same in every process."""
    hosted: frozenset[str] = frozenset()
    """The processes whose actors share this actor's loop (its own; every one in serial mode).
    At a stop their actors stop one after another: the processes in
    :meth:`~sfbus.routing.RoutingTable.stop_order` (a process before those its signals reach
    that never reach it back, so ``rollout``'s workers before the statistics they report to),
    each one's actors in reverse topology order; the actors of
    other processes stop at the same time, and what they send from ``on_stop`` arrives while
    this loop's actors stop (an ``async`` slot still runs then, until ``on_stop`` returns)."""
    _attached: dict[str, SharedArray] = field(default_factory=dict)
    pools: list[SlotPool] = field(default_factory=list)

    @property
    def settings(self) -> dict[str, Any]:
        """The topology's shared settings."""
        return self.table.topology.settings

    def shared(self, name: str) -> SharedArray:
        """The run's shared array ``name``, attached on first use (created by the launcher)."""
        array = self._attached.get(name)
        if array is None:
            spec = self.array_specs.get(name)
            if spec is None:
                raise KeyError(f"no shared array {name!r} in this run")
            array = self._attached[name] = SharedArray.attach(self.run_id, spec)
        return array

    def slot_pool(self, name: str, owner: str, *, actor: str) -> SlotPool:
        """Open slot pool ``name`` (created from ``SlotPool.array_specs``) as ``actor``.

        ``actor`` owns it when it is ``owner``; the pool's occupancy is exported as a metric.
        """
        arrays = {f"{name}.{part}": self.shared(f"{name}.{part}") for part in ("state", "header")}
        pool = SlotPool(name, SharedMemory(self.run_id, arrays), owner, is_owner=actor == owner,
                        actor=actor)
        self.pools.append(pool)
        return pool

    def close(self) -> None:
        """Detach every shared array this process attached."""
        for array in self._attached.values():
            array.close()
        self._attached.clear()
