"""Pools of shared-memory slot indices with one owner, whose state survives the owner's restart.

A pool hands out the integers ``0..size-1`` (rows of a run's shared buffers) from a free list and
takes them back. Only the owner acquires and releases, so no lock is needed; every other process
may open the same pool read-only to report occupancy. Its state lives in two shared arrays
(see :meth:`SlotPool.array_specs`) that the launcher creates with the rest of the run's memory:

- ``{name}.state``: int8 per slot, 0 free and 1 taken; the truth a restarted owner rebuilds from.
- ``{name}.header``: int64 ``[in_use, acquired_total, released_total]`` for O(1) reads by others.
"""

from __future__ import annotations

import operator
import os

import numpy as np

from sfbus.errors import SlotPoolError, SlotPoolExhausted
from sfbus.shm import ArraySpec, SharedMemory

__all__ = ["SlotPool"]

_FREE = 0
_TAKEN = 1
_IN_USE, _ACQUIRED, _RELEASED = 0, 1, 2
_HEADER_FIELDS = 3


class SlotPool:
    """Integer slots ``0..size-1`` handed out by one owner from a free list in shared memory.

    The owner (``is_owner=True``) calls :meth:`acquire` / :meth:`release` on its event loop;
    they are O(1) and meant for ~10^5 calls per second. Built as owner, the pool rebuilds its
    free list from the shared state, so a restarted owner keeps the slots still taken by its old
    self. Instances with ``is_owner=False`` only read :attr:`in_use` / :attr:`free`; changing
    them raises :class:`SlotPoolError`. Two owners of one pool at once is a wiring bug this class
    cannot see.
    """

    @staticmethod
    def array_specs(name: str, size: int) -> list[ArraySpec]:
        """Return the shared arrays a pool of ``size`` slots needs; the launcher creates them."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"slot pool {name!r}: size must be a positive int, not {size!r}")
        return [
            ArraySpec(f"{name}.state", (size,), "int8"),
            ArraySpec(f"{name}.header", (_HEADER_FIELDS,), "int64"),
        ]

    def __init__(
        self,
        name: str,
        shm: SharedMemory,
        owner: str,
        *,
        is_owner: bool,
        actor: str | None = None,
    ) -> None:
        """Open pool ``name`` in ``shm``, owned by actor ``owner``.

        ``is_owner`` says whether this instance is that owner; ``actor`` names the non-owner using
        it, for error messages (defaults to this process's pid). Raises SlotPoolError when the
        pool's arrays are missing from ``shm``.
        """
        self._name = name
        self._owner = owner
        self._is_owner = is_owner
        self._actor = owner if is_owner else actor
        arrays = []
        for suffix in ("state", "header"):
            key = f"{name}.{suffix}"
            if key not in shm:
                raise SlotPoolError(
                    f"slot pool {name!r}: shared array {key!r} is missing from run {shm.run_id};"
                    f" create the run's memory with SlotPool.array_specs({name!r}, size)"
                )
            arrays.append(shm[key].numpy)
        self._state_np, self._header_np = arrays
        if self._state_np.ndim != 1 or self._header_np.shape != (_HEADER_FIELDS,):
            raise SlotPoolError(f"slot pool {name!r}: its shared arrays do not match array_specs()")
        self._size = len(self._state_np)
        # memoryviews index ~2x faster than numpy scalars: this is the hot path.
        self._state = memoryview(self._state_np).cast("B").cast("b")
        self._header = memoryview(self._header_np).cast("B").cast("q")
        self._free: list[int] = []
        if is_owner:
            self._rebuild()

    @property
    def name(self) -> str:
        """The pool's name (prefix of its shared arrays)."""
        return self._name

    @property
    def owner(self) -> str:
        """The name of the actor that owns the pool."""
        return self._owner

    @property
    def is_owner(self) -> bool:
        """Whether this instance may acquire and release."""
        return self._is_owner

    @property
    def size(self) -> int:
        """Number of slots."""
        return self._size

    @property
    def in_use(self) -> int:
        """Number of taken slots (as last written by the owner)."""
        if self._is_owner:
            return self._size - len(self._free)
        return int(self._header[_IN_USE])

    @property
    def free(self) -> int:
        """Number of free slots (as last written by the owner)."""
        return self._size - self.in_use

    @property
    def acquired_total(self) -> int:
        """Slots acquired since the run started, across owner restarts."""
        return int(self._header[_ACQUIRED])

    @property
    def released_total(self) -> int:
        """Slots released or reclaimed since the run started, across owner restarts."""
        return int(self._header[_RELEASED])

    def taken(self) -> list[int]:
        """Return the taken slot indices, in order (O(size); for diagnostics, not the hot path)."""
        return np.flatnonzero(self._state_np != _FREE).tolist()

    def acquire(self) -> int:
        """Take a free slot; raise SlotPoolExhausted when none is free."""
        if not self._is_owner:
            raise self._not_owner("acquire")
        try:
            slot = self._free.pop()
        except IndexError:
            raise SlotPoolExhausted(
                f"slot pool {self._name!r}: all {self._size} slots are taken;"
                " wait for a release or make the pool larger"
            ) from None
        self._take(slot)
        return slot

    def try_acquire(self) -> int | None:
        """Take a free slot, or return None when none is free."""
        if not self._is_owner:
            raise self._not_owner("acquire")
        if not self._free:
            return None
        slot = self._free.pop()
        self._take(slot)
        return slot

    def acquire_many(self, n: int) -> list[int]:
        """Take ``n`` free slots, all or none; raise SlotPoolExhausted when fewer are free."""
        if not self._is_owner:
            raise self._not_owner("acquire")
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"slot pool {self._name!r}: cannot acquire {n} slots")
        if n > len(self._free):
            raise SlotPoolExhausted(
                f"slot pool {self._name!r}: {n} slots requested but only {len(self._free)}"
                f" of {self._size} are free; wait for releases or make the pool larger"
            )
        slots = [self._free.pop() for _ in range(n)]
        for slot in slots:
            self._take(slot)
        return slots

    def try_acquire_block(self, size: int) -> list[int] | None:
        """Take the first wholly free block of ``size`` consecutive slots (blocks start at
        multiples of ``size``, which must divide the pool): its slots ascending, or None.

        O(size of the pool); for callers that need contiguous buffer rows (batched sampling).
        """
        if not self._is_owner:
            raise self._not_owner("acquire")
        size = operator.index(size)
        if size <= 0 or self._size % size:
            raise ValueError(f"slot pool {self._name!r}: {self._size} slots are not whole blocks"
                             f" of {size}")
        free = np.flatnonzero(~self._state_np.reshape(-1, size).any(axis=1))
        if not len(free):
            return None
        start = int(free[0]) * size
        self._free = [s for s in self._free if not start <= s < start + size]
        block = list(range(start, start + size))
        for slot in block:
            self._take(slot)
        return block

    def release(self, slot: int) -> None:
        """Give ``slot`` back; raise SlotPoolError if it is out of range or already free."""
        if not self._is_owner:
            raise self._not_owner(f"release of slot {slot}")
        # operator.index turns numpy ints into ints (so acquire never returns np.int64) and
        # rejects floats.
        slot = operator.index(slot)
        if not 0 <= slot < self._size:
            raise SlotPoolError(
                f"slot pool {self._name!r}: slot {slot} is out of range 0..{self._size - 1}"
            )
        if self._state[slot] == _FREE:
            raise SlotPoolError(f"slot pool {self._name!r}: slot {slot} released twice")
        self._state[slot] = _FREE
        self._free.append(slot)
        self._header[_IN_USE] -= 1
        self._header[_RELEASED] += 1

    def reclaim_all(self) -> list[int]:
        """Free every taken slot and return their indices; only when nobody downstream holds one."""
        if not self._is_owner:
            raise self._not_owner("reclaim_all")
        taken = self.taken()
        self._state_np[:] = _FREE
        self._header[_RELEASED] += len(taken)
        self._rebuild()
        return taken

    def _take(self, slot: int) -> None:
        self._state[slot] = _TAKEN
        self._header[_IN_USE] += 1
        self._header[_ACQUIRED] += 1

    def _rebuild(self) -> None:
        # Pop from the end, so the lowest free index goes out first; released slots are reused
        # first (LIFO), while their buffer rows are still warm in the cache.
        self._free = np.flatnonzero(self._state_np == _FREE)[::-1].tolist()
        # The header may be stale if the old owner died between the state write and the header's.
        self._header[_IN_USE] = self._size - len(self._free)

    def _not_owner(self, what: str) -> SlotPoolError:
        who = repr(self._actor) if self._actor is not None else f"process {os.getpid()}"
        return SlotPoolError(
            f"slot pool {self._name!r}: {what} by {who}, which does not own the pool"
            f" (owner: {self._owner!r})"
        )

    def __repr__(self) -> str:
        role = "owner" if self._is_owner else "reader"
        return (
            f"<SlotPool {self._name!r} owner={self._owner!r} ({role})"
            f" in_use={self.in_use}/{self._size}>"
        )
