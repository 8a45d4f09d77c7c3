"""Slot pools: one owner, a free list, state in shared memory that survives the owner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfbus.errors import SlotPoolError, SlotPoolExhausted
from sfbus.shm import ArraySpec, SharedMemory, new_run_id
from sfbus.shm_cleanup import remove_run_segments
from sfbus.slot_pool import SlotPool

REPO = Path(__file__).resolve().parents[2]
SIZE = 4


@pytest.fixture
def shm() -> Iterator[SharedMemory]:
    """A run's memory holding pool 'traj' of SIZE slots; removed after the test."""
    run_id = new_run_id()
    try:
        memory = SharedMemory.create(run_id, SlotPool.array_specs("traj", SIZE))
        yield memory
        memory.close()
    finally:
        remove_run_segments(run_id)


@pytest.fixture
def pool(shm: SharedMemory) -> SlotPool:
    return SlotPool("traj", shm, "rollout", is_owner=True)


def test_array_specs() -> None:
    assert SlotPool.array_specs("traj", 3) == [
        ArraySpec("traj.state", (3,), "int8"),
        ArraySpec("traj.header", (3,), "int64"),
    ]
    with pytest.raises(ValueError, match="size must be a positive int"):
        SlotPool.array_specs("traj", 0)


def test_acquire_release_cycles(pool: SlotPool) -> None:
    assert (pool.size, pool.in_use, pool.free) == (SIZE, 0, SIZE)
    assert [pool.acquire() for _ in range(3)] == [0, 1, 2]
    assert (pool.in_use, pool.free) == (3, 1)
    pool.release(1)
    assert pool.acquire() == 1  # the slot released last goes out first, still warm in cache
    for _ in range(100):
        slot = pool.acquire()
        pool.release(slot)
    assert pool.in_use == 3
    assert pool.taken() == [0, 1, 2]
    assert (pool.acquired_total, pool.released_total) == (104, 101)


def test_release_accepts_numpy_ints_and_returns_plain_ints(pool: SlotPool) -> None:
    pool.acquire()
    pool.release(np.int64(0))
    slot = pool.acquire()
    assert type(slot) is int


def test_exhaustion(pool: SlotPool) -> None:
    assert pool.acquire_many(SIZE) == [0, 1, 2, 3]
    with pytest.raises(SlotPoolExhausted) as info:
        pool.acquire()
    assert str(info.value) == (
        "slot pool 'traj': all 4 slots are taken; wait for a release or make the pool larger"
    )
    assert pool.try_acquire() is None
    pool.release(2)
    assert pool.try_acquire() == 2


def test_acquire_many_is_all_or_none(pool: SlotPool) -> None:
    pool.acquire()
    with pytest.raises(SlotPoolExhausted) as info:
        pool.acquire_many(4)
    assert str(info.value) == (
        "slot pool 'traj': 4 slots requested but only 3 of 4 are free;"
        " wait for releases or make the pool larger"
    )
    assert pool.in_use == 1
    assert pool.acquire_many(0) == []


def test_blocks_are_taken_whole_and_aligned(pool: SlotPool, shm: SharedMemory) -> None:
    pool.release(pool.acquire())  # slot 0 goes back to the free list's end: reused first
    taken = pool.acquire()
    assert taken == 0
    assert pool.try_acquire_block(2) == [2, 3]  # block 0 is partly taken
    assert pool.try_acquire_block(2) is None
    assert (pool.in_use, pool.acquire(), pool.try_acquire()) == (3, 1, None)
    pool.release(2)
    assert pool.try_acquire_block(2) is None  # slot 3 of block 1 is still taken
    pool.release(3)
    assert pool.try_acquire_block(2) == [2, 3]
    assert SlotPool("traj", shm, "rollout", is_owner=True).free == 0  # the state says taken
    with pytest.raises(ValueError, match="not whole blocks of 3"):
        pool.try_acquire_block(3)
    with pytest.raises(SlotPoolError, match="acquire by 'learner'"):
        SlotPool("traj", shm, "rollout", is_owner=False, actor="learner").try_acquire_block(2)


def test_double_release(pool: SlotPool) -> None:
    slot = pool.acquire_many(3)[2]
    pool.release(slot)
    with pytest.raises(SlotPoolError) as info:
        pool.release(slot)
    assert str(info.value) == "slot pool 'traj': slot 2 released twice"
    assert pool.in_use == 2


def test_release_out_of_range(pool: SlotPool) -> None:
    for slot in (4, -1):
        with pytest.raises(SlotPoolError) as info:
            pool.release(slot)
        assert str(info.value) == f"slot pool 'traj': slot {slot} is out of range 0..3"


def test_non_owner_may_only_read(shm: SharedMemory, pool: SlotPool) -> None:
    reader = SlotPool("traj", shm, "rollout", is_owner=False, actor="learner")
    pool.acquire_many(3)
    assert (reader.in_use, reader.free, reader.size) == (3, 1, SIZE)
    with pytest.raises(SlotPoolError) as info:
        reader.release(1)
    assert str(info.value) == (
        "slot pool 'traj': release of slot 1 by 'learner', which does not own the pool"
        " (owner: 'rollout')"
    )
    with pytest.raises(SlotPoolError) as info:
        reader.acquire()
    assert str(info.value) == (
        "slot pool 'traj': acquire by 'learner', which does not own the pool (owner: 'rollout')"
    )
    for call in (reader.try_acquire, lambda: reader.acquire_many(1), reader.reclaim_all):
        with pytest.raises(SlotPoolError, match="which does not own the pool"):
            call()
    anonymous = SlotPool("traj", shm, "rollout", is_owner=False)
    with pytest.raises(SlotPoolError, match=f"by process {os.getpid()}, which does not own"):
        anonymous.release(1)
    assert pool.in_use == 3


def test_recreated_owner_sees_the_same_taken_slots(shm: SharedMemory, pool: SlotPool) -> None:
    pool.acquire_many(3)
    pool.release(1)
    again = SlotPool("traj", shm, "rollout", is_owner=True)
    assert again.taken() == [0, 2]
    assert again.in_use == 2
    assert [again.acquire(), again.acquire()] == [1, 3]
    with pytest.raises(SlotPoolExhausted):
        again.acquire()


def test_restarted_owner_process_continues(shm: SharedMemory) -> None:
    # The first owner lives in a process that exits, as after a crash.
    code = f"""
        from sfbus.shm import SharedMemory
        from sfbus.slot_pool import SlotPool
        shm = SharedMemory.attach({shm.run_id!r}, SlotPool.array_specs("traj", {SIZE}))
        pool = SlotPool("traj", shm, "rollout", is_owner=True)
        assert pool.acquire_many(3) == [0, 1, 2]
        pool.release(0)
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    pool = SlotPool("traj", shm, "rollout", is_owner=True)
    assert pool.taken() == [1, 2]
    pool.release(2)
    with pytest.raises(SlotPoolError, match="slot 2 released twice"):
        pool.release(2)


def test_reclaim_all(shm: SharedMemory, pool: SlotPool) -> None:
    pool.acquire_many(3)
    pool.release(0)
    assert pool.reclaim_all() == [1, 2]
    assert pool.in_use == 0
    assert SlotPool("traj", shm, "rollout", is_owner=False).in_use == 0
    assert pool.acquire_many(SIZE) == [0, 1, 2, 3]
    assert pool.reclaim_all() == [0, 1, 2, 3]
    assert pool.reclaim_all() == []


def test_missing_arrays_are_named(shm: SharedMemory) -> None:
    with pytest.raises(SlotPoolError) as info:
        SlotPool("batch", shm, "batcher", is_owner=True)
    assert str(info.value) == (
        f"slot pool 'batch': shared array 'batch.state' is missing from run {shm.run_id};"
        " create the run's memory with SlotPool.array_specs('batch', size)"
    )


# The fixture's memory is shared by every example; each example starts with reclaim_all().
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(st.one_of(st.none(), st.integers(0, SIZE - 1)), max_size=30))
def test_pool_matches_a_model(shm: SharedMemory, ops: list[int | None]) -> None:
    # None means acquire; an int means release that slot if the model holds it.
    pool = SlotPool("traj", shm, "rollout", is_owner=True)
    pool.reclaim_all()
    held: set[int] = set()
    for op in ops:
        if op is None:
            slot = pool.try_acquire()
            if len(held) == SIZE:
                assert slot is None
            else:
                assert slot is not None and slot not in held
                held.add(slot)
        elif op in held:
            pool.release(op)
            held.remove(op)
        else:
            with pytest.raises(SlotPoolError, match="released twice"):
                pool.release(op)
        assert pool.in_use == len(held)
        assert sorted(pool.taken()) == sorted(held)
    assert SlotPool("traj", shm, "rollout", is_owner=True).taken() == sorted(held)
