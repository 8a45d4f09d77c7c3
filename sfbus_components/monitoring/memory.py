"""Memory figures of a process, as Sample Factory reports them (``stats/memory_<process>``)."""

from __future__ import annotations

import math
import os

import torch

_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 1e6 if hasattr(os, "sysconf") else 0.004096


def process_memory_mb() -> float:
    """This process's resident memory in MB (NaN where ``/proc`` cannot tell)."""
    try:
        with open("/proc/self/statm") as statm:  # "size resident shared ...", in pages
            return int(statm.read().split()[1]) * _PAGE_MB
    except (OSError, IndexError, ValueError):
        return math.nan


def gpu_memory_mb(device: torch.device) -> float:
    """MB the caching allocator has handed to tensors on ``device``; NaN off a GPU."""
    return torch.cuda.memory_allocated(device) / 1e6 if device.type == "cuda" else math.nan
