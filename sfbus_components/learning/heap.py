"""glibc malloc settings for a process that allocates and frees big tensors on every step."""

from __future__ import annotations

import ctypes

# mallopt parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory() -> bool:
    """Have malloc serve blocks of every size from one heap for all threads and keep freed
    memory for reuse; True where it applied (glibc).

    By default glibc maps each block over 32 MB afresh and unmaps it when freed, and the
    learner's activations are such blocks (36 MB per conv layer output of a bfloat16 batch);
    threads other than the main one get heaps of their own, trimmed as they empty. Every step
    then faulted its pages in again, zeroed by the kernel: 47k page faults per batch in a
    training run, ~100 with these settings, 15-18% of a learner step when timed alone. The
    price: the process keeps its peak heap, which a learner reaches on every step anyway.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: its allocator has its own policy
        return False
    settings = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_ARENA_MAX, 1))
    return all(mallopt(key, value) == 1 for key, value in settings)
