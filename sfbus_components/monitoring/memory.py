"""Memory figures of a process, as Sample Factory reports them (``stats/memory_<process>``)."""

from __future__ import annotations

import math
import os

import torch

_PAGE_MIB = (os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096) / 2**20


def process_memory_mb() -> float:
    """This process's resident memory in MiB, as Sample Factory's ``memory_consumption_mb``
    (NaN where ``/proc`` cannot tell)."""
    try:
        with open("/proc/self/statm") as statm:  # "size resident shared ...", in pages
            return int(statm.read().split()[1]) * _PAGE_MIB
    except (OSError, IndexError, ValueError):
        return math.nan


def gpu_memory_mb(device: torch.device) -> float:
    """MB (1e6 bytes, as Sample Factory's ``gpu_mem_learner``) the caching allocator has handed
    to tensors on ``device``; NaN off a GPU."""
    return torch.cuda.memory_allocated(device) / 1e6 if device.type == "cuda" else math.nan
