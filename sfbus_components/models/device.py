"""Which torch device an actor computes on: the ``device`` setting resolved against the machine.

``auto`` takes a CUDA GPU when one is visible and the CPU otherwise; ``cuda`` asks for a GPU;
``cuda:N`` names one. Without an index, the actor of policy ``i`` in local rank ``r`` gets GPU
``(r + i) mod n``: a population on one rank spreads over the machine's GPUs as Sample Factory places
policies, and under ``torchrun --nproc-per-node G`` rank ``r``'s learner and inference share GPU
``r`` (``LOCAL_RANK``, which torchrun sets and ``sfbus run --nodes`` sets to 0). Shared memory stays
on the host either way: what runs on a GPU copies its inputs in through pinned host buffers.
"""

from __future__ import annotations

import os
import re

import torch

_SETTING = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device(setting: str) -> None:
    """Raise ValueError (a located error at validation) unless ``setting`` can be had here."""
    if not _SETTING.fullmatch(setting):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {setting!r}")
    if not setting.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise ValueError(f"device {setting!r}: no CUDA GPU is visible here (torch "
                         f"{torch.__version__}, CUDA build {torch.version.cuda}); use auto or cpu")
    index = setting.partition(":")[2]
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"device {setting!r}: this machine has {torch.cuda.device_count()} "
                         f"CUDA GPU(s), numbered from 0")


def local_rank() -> int:
    """This process's rank among the ranks torchrun started on this machine (0 when alone)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def gpu_index(policy: int, rank: int, gpus: int) -> int:
    """The GPU of ``policy``'s actor in local rank ``rank`` among ``gpus``: ranks first, then
    policies, so G ranks of one policy take one GPU each and one rank's policies spread."""
    return (rank + policy) % gpus


def resolve_device(setting: str, policy: int = 0) -> torch.device:
    """The device ``setting`` means for the actor of ``policy`` in this process's local rank."""
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if setting in ("auto", "cuda"):
        return torch.device("cuda", gpu_index(policy, local_rank(), torch.cuda.device_count()))
    return torch.device(setting)


def describe_device(device: torch.device) -> str:
    """``device`` for a log line: a GPU with its name."""
    if device.type != "cuda":
        return str(device)
    return f"{device} ({torch.cuda.get_device_name(device)})"
