"""ELU on CPU tensors through a C loop over glibc's vector ``expm1``, compiled for this machine
on first use: torch's CPU kernel costs 1.5-2.5 ns a value (a fifth of a learner step and a
quarter of an inference pass of the paper's model), this loop 0.5-0.7 ns, with torch's values in
bfloat16 and within a float32 rounding or two in float32. Where no C compiler or libmvec is at hand,
or torch runs several threads, or the tensor is not a dense CPU float32/bfloat16 one, torch's
ELU runs instead."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
/* glibc's vector variants (libmvec); math.h declares them only under -ffast-math, whose other
   rewrites (and FTZ set at load time) this code must not get */
__attribute__((simd("notinbranch"))) float expm1f(float);
__attribute__((simd("notinbranch"))) float expf(float);

static inline float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
/* round to nearest even, NaN to torch's 0x7fc0: c10::BFloat16's rounding */
static inline uint16_t float_to_bf16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16); }

void elu_f32(const float *restrict x, float *restrict y, int64_t n) {
  for (int64_t i = 0; i < n; i++) { float v = x[i], e = expm1f(v); y[i] = v > 0.f ? v : e; } }
void elu_bf16(const uint16_t *restrict x, uint16_t *restrict y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = bf16_to_float(x[i]), e = expm1f(v); y[i] = float_to_bf16(v > 0.f ? v : e); } }
/* torch's elu_backward from the input: grad where x > 0, grad * exp(x) elsewhere */
void elu_backward_f32(const float *restrict g, const float *restrict x, float *restrict d,
                      int64_t n) {
  for (int64_t i = 0; i < n; i++) { float v = x[i], e = g[i] * expf(v); d[i] = v > 0.f ? g[i] : e; } }
void elu_backward_bf16(const uint16_t *restrict g, const uint16_t *restrict x,
                       uint16_t *restrict d, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = bf16_to_float(x[i]), gv = bf16_to_float(g[i]), e = gv * expf(v);
    d[i] = float_to_bf16(v > 0.f ? gv : e); } }
"""
_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fPIC", "-shared")
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _cache_dir() -> Path:
    """Where compiled kernels are kept between runs."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "sfbus"


def _machine_key() -> str:
    """What the compiled code depends on: the source, the flags, the compiler, this CPU."""
    try:
        cpu = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("flags")), "")
    except OSError:
        cpu = ""
    text = "\n".join([_SOURCE, *_FLAGS, os.environ.get("CC", "cc"), platform.machine(), cpu])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _compile(target: Path) -> None:
    """Compile the kernels into ``target``, atomically: processes may race to it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source, built = Path(tmp) / "elu.c", Path(tmp) / target.name
        source.write_text(_SOURCE)
        subprocess.run([os.environ.get("CC", "cc"), *_FLAGS, str(source), "-o", str(built),
                        "-lm"], check=True, capture_output=True, timeout=120)
        os.replace(built, target)


@functools.cache
def kernels() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None where they cannot be built (torch's ELU
    then runs)."""
    if platform.system() != "Linux":  # libmvec is glibc's
        return None
    target = _cache_dir() / f"elu-{_machine_key()}.so"
    try:
        if not target.exists():
            _compile(target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("ELU runs through torch: the C kernel could not be built (%s)", exc)
        return None


def _dense(x: Tensor) -> bool:
    """Whether ``x``'s elements fill its storage in order, in one of the layouts used here."""
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(
        memory_format=torch.channels_last))


def _runs_here(*tensors: Tensor) -> bool:
    """Whether the C kernels take these tensors (else torch's ELU does)."""
    x = tensors[0]
    return (x.device.type == "cpu" and x.dtype in _SUFFIX and torch.get_num_threads() == 1
            and all(t.dtype == x.dtype and t.stride() == x.stride() and _dense(t)
                    for t in tensors) and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling() and kernels() is not None)


def _call(name: str, *tensors: Tensor) -> Tensor:
    """Run kernel ``name`` over ``tensors``' elements into a new tensor like the first."""
    out = torch.empty_like(tensors[0])
    lib = kernels()
    assert lib is not None
    getattr(lib, f"{name}_{_SUFFIX[out.dtype]}")(
        *(ctypes.c_void_p(t.data_ptr()) for t in (*tensors, out)), ctypes.c_int64(out.numel()))
    return out


class _EluFunction(torch.autograd.Function):
    """ELU with the C kernels forward and backward (its input saved, as torch's ELU saves it)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return _call("elu", x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        grad = grad.contiguous(memory_format=_format_of(x))
        if _runs_here(grad, x):
            return _call("elu_backward", grad, x)
        return torch.ops.aten.elu_backward(grad, 1.0, 1, 1, False, x)


def _format_of(x: Tensor) -> torch.memory_format:
    """``x``'s memory format (contiguous or channels-last)."""
    return torch.contiguous_format if x.is_contiguous() else torch.channels_last


def elu(x: Tensor) -> Tensor:
    """``F.elu(x)`` (alpha 1), through the C kernels where they run."""
    if not _runs_here(x):
        return F.elu(x)
    return _EluFunction.apply(x) if x.requires_grad and torch.is_grad_enabled() else _call(
        "elu", x)


class ELU(nn.Module):
    """``nn.ELU()`` through :func:`elu`."""

    def forward(self, x: Tensor) -> Tensor:
        """ELU of ``x``."""
        return elu(x)
