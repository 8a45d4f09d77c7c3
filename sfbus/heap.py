"""glibc malloc settings for the processes of a run: one heap, freed memory kept for reuse."""

from __future__ import annotations

import ctypes

# mallopt parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory() -> bool:
    """Have malloc serve blocks of every size from one heap for all threads and keep freed
    memory for reuse; True where it applied (glibc). Call it before any thread allocates.

    By default glibc maps each block over 32 MB afresh and unmaps it when freed, and a
    learner's activations are such blocks (36 MB per conv layer output of a bfloat16 batch,
    71-117 MB in float32); threads other than the main one get heaps of their own, trimmed as
    they empty. Every step then faulted its pages in again, zeroed by the kernel: 47k page
    faults per batch in a training run, ~100 with these settings, 15-18% of a learner step when
    timed alone. A thread keeps the heap it got at its first allocation, and a thread that ends
    passes its heap on to the next one started, so the settings hold only for threads that
    allocate after them: set later in a run's process, whose watcher threads had allocated
    already, the training threads kept heaps of their own, which hold no block over 64 MB, and
    a float32 learner step still faulted 28-98k pages. The price: the process keeps its peak
    heap, which a learner reaches on every step anyway.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: its allocator has its own policy
        return False
    settings = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_ARENA_MAX, 1))
    return all(mallopt(key, value) == 1 for key, value in settings)
