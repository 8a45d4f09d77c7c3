"""Which arithmetic the encoder runs in: bfloat16 autocast where the hardware makes it fast."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import torch

Precision = Literal["auto", "float32", "bfloat16"]

# CPU flags that give native bf16 matrix arithmetic (oneDNN uses AMX or AVX-512 BF16 for conv
# and matmul under autocast); elsewhere bf16 is emulated and slower than float32.
_CPU_BF16_FLAGS = {"amx_bf16", "avx512_bf16"}


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True when this CPU has AMX or AVX-512 BF16 instructions."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return bool(_CPU_BF16_FLAGS & set(flags))


@functools.cache
def onednn_has_bf16() -> bool:
    """True when this torch build's oneDNN has bfloat16 kernels for this CPU (AVX-512 or newer).

    The packed inference step calls oneDNN's bf16 ops directly; on an AVX2-only CPU they do not
    exist and fail at the first call, while eager bf16 autocast still runs (emulated, slowly).
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN, or without the probe
        return False


def uses_bf16(precision: Precision, device: torch.device) -> bool:
    """Whether ``precision`` means bfloat16 autocast on ``device`` (``auto``: where it is fast:
    on a CPU, bf16 instructions that oneDNN may use; ``ONEDNN_MAX_CPU_ISA=AVX2`` forbids them,
    so a run under it computes as on an AVX2-only CPU)."""
    if precision != "auto":
        return precision == "bfloat16"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_fast_bf16() and onednn_has_bf16()
