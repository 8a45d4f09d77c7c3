"""C kernels for the model's elementwise passes on CPU, compiled for this machine with the
system's C compiler on first use and kept in ``~/.cache/sfbus/``: ELU forward and backward over
glibc's vector ``exp``/``expm1`` (torch's CPU ELU costs 1.5-2.5 ns a value, these 0.5-0.7), and
uint8 frames normalized per pixel straight into channels-last float32 or bfloat16 (torch needs an
interleaving copy, the affine map, the clip and a rounding copy: 57 -> 34 ms for a learner's
1056 frames). Each is torch's arithmetic (the same FMA, clip and round-to-nearest-even), so the
values equal torch's, but for ``exp``/``expm1``, where libmvec and torch's SLEEF round alike in
bfloat16 and a float32 rounding or two apart. Where no compiler or libmvec is at hand,
:func:`library` is None and the callers run torch's ops."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from sfbus_components.models.threaded_sequence import run_together

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
/* round to nearest even, NaN to 0x7fc0: c10::BFloat16's rounding (one select, no branch:
   GCC vectorizes a loop for AVX2 only where it can if-convert all of it) */
static inline uint16_t float_to_bf16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0 : rounded; }
#define AS_FLOAT(v) (v)

void elu_f32(const float *restrict x, float *restrict y, int64_t n) {
  for (int64_t i = 0; i < n; i++) { float v = x[i], e = expm1f(v); y[i] = v > 0.f ? v : e; } }
void elu_bf16(const uint16_t *restrict x, uint16_t *restrict y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = bf16_to_float(x[i]), e = expm1f(v); y[i] = float_to_bf16(v > 0.f ? v : e); } }
/* torch's elu_backward from the input: grad * exp(x) where x <= 0, else grad (grad * exp(0),
   exactly; NaN counts as > 0, as in torch). Written so that GCC vectorizes it for AVX2 too:
   a select between grad and grad * exp(x) was left scalar there (6 ns a value, not 0.6) */
void elu_backward_f32(const float *restrict g, const float *restrict x, float *restrict d,
                      int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i], e = expf(v < 0.f ? v : 0.f); d[i] = g[i] * e; } }
void elu_backward_bf16(const uint16_t *restrict g, const uint16_t *restrict x,
                       uint16_t *restrict d, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = bf16_to_float(x[i]), e = expf(v < 0.f ? v : 0.f);
    d[i] = float_to_bf16(bf16_to_float(g[i]) * e); } }

/* torch's addcmul(offset, x, scale) (one FMA, as its vector kernel computes it), then clamp */
static inline float affine(uint8_t x, float scale, float offset, float clip) {
  float r = __builtin_fmaf((float)x, scale, offset);
  r = r < -clip ? -clip : r; return r > clip ? clip : r; }
/* frames [N, C, P] -> [N, P, C], the factors [P, C]; a copy per common channel count lets the
   compiler vectorize each */
#define FRAMES(NAME, T, STORE, C)                                                            \
static void NAME(const uint8_t *restrict x, const float *restrict scale,                    \
                 const float *restrict offset, int64_t frames, int64_t channels,            \
                 int64_t pixels, float clip, T *restrict out) {                             \
  const int64_t ch = C ? C : channels;                                                      \
  for (int64_t f = 0; f < frames; f++) {                                                    \
    const uint8_t *in = x + f * ch * pixels; T *o = out + f * ch * pixels;                  \
    for (int64_t p = 0; p < pixels; p++)                                                    \
      for (int64_t c = 0; c < ch; c++) {                                                    \
        int64_t k = p * ch + c;                                                             \
        o[k] = STORE(affine(in[c * pixels + p], scale[k], offset[k], clip)); } } }
FRAMES(frames_f32_any, float, AS_FLOAT, 0)
FRAMES(frames_f32_1, float, AS_FLOAT, 1)
FRAMES(frames_f32_3, float, AS_FLOAT, 3)
FRAMES(frames_f32_4, float, AS_FLOAT, 4)
FRAMES(frames_bf16_any, uint16_t, float_to_bf16, 0)
FRAMES(frames_bf16_1, uint16_t, float_to_bf16, 1)
FRAMES(frames_bf16_3, uint16_t, float_to_bf16, 3)
FRAMES(frames_bf16_4, uint16_t, float_to_bf16, 4)
void normalize_frames_f32(const uint8_t *x, const float *scale, const float *offset,
                          int64_t frames, int64_t channels, int64_t pixels, float clip,
                          float *out) {
  (channels == 3 ? frames_f32_3 : channels == 4 ? frames_f32_4 : channels == 1 ? frames_f32_1
   : frames_f32_any)(x, scale, offset, frames, channels, pixels, clip, out); }
void normalize_frames_bf16(const uint8_t *x, const float *scale, const float *offset,
                           int64_t frames, int64_t channels, int64_t pixels, float clip,
                           uint16_t *out) {
  (channels == 3 ? frames_bf16_3 : channels == 4 ? frames_bf16_4 : channels == 1
   ? frames_bf16_1 : frames_bf16_any)(x, scale, offset, frames, channels, pixels, clip, out); }

/* A linear layer over weights stored in bfloat16, its arithmetic float32: y = x W^T + b for a
   few rows x [R, K], where reading W is the pass's cost. The weights lie in blocks of 32 outputs,
   [N / 32][K][32], each run of 16 ordered so that interleaving it with zeros within the 128-bit
   halves of a 256-bit vector yields its floats in order (the bfloat16 bits are the float's high
   half). Each output is its bias plus one in-order FMA chain over k, the same for any R: a row's
   result never depends on the rows beside it. */
typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v16h __attribute__((vector_size(32)));
#if defined(__clang__) || __GNUC__ >= 12
#define INTERLEAVE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define INTERLEAVE(a, b, ...) __builtin_shuffle(a, b, (v16h){__VA_ARGS__})
#endif
static const int64_t BF16_ORDER[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
static inline void widen16(const uint16_t *p, v8f *lo, v8f *hi) {
  v16h h, zero = {0}; memcpy(&h, p, 32);
  v16h l = INTERLEAVE(zero, h, 0, 16, 1, 17, 2, 18, 3, 19, 8, 24, 9, 25, 10, 26, 11, 27);
  v16h u = INTERLEAVE(zero, h, 4, 20, 5, 21, 6, 22, 7, 23, 12, 28, 13, 29, 14, 30, 15, 31);
  memcpy(lo, &l, 32); memcpy(hi, &u, 32); }
/* w [N, K] float32 -> the blocks above, rounded to nearest even; outputs past N are zeros.
   A tile of 32 rows x 16 inputs at a time: each row's run is read and rounded as a vector, then
   written out input by input (4x faster than one value per output, which read 32 rows at once;
   an inference worker packs its FC and GRU at every new version of the weights). */
void pack_bf16_weights(const float *restrict w, int64_t n, int64_t k, uint16_t *restrict out) {
  uint16_t tile[32][16];
  for (int64_t b = 0; b < (n + 31) / 32; b++)
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
      const int64_t kn = k - k0 < 16 ? k - k0 : 16;
      for (int64_t p = 0; p < 32; p++) {
        const int64_t row = b * 32 + (p & 16) + BF16_ORDER[p & 15];
        if (row >= n) { memset(tile[p], 0, sizeof tile[p]); continue; }
        for (int64_t j = 0; j < kn; j++) tile[p][j] = float_to_bf16(w[row * k + k0 + j]); }
      for (int64_t j = 0; j < kn; j++)
        for (int64_t p = 0; p < 32; p++) out[(b * k + k0 + j) * 32 + p] = tile[p][j]; } }
/* y [R, N32] (N32: N rounded up to 32) from x [R, K], the packed weights and bias [N32]; two
   rows per read of the weights, whose 8 + 4 vectors fit AVX2's 16 registers */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=fast")))  /* the FMAs: one rounding per product-sum */
#endif
void linear_bf16_weights(const float *restrict x, const uint16_t *restrict wb,
                         const float *restrict bias, float *restrict y, int64_t rows,
                         int64_t k_in, int64_t n_out) {
  for (int64_t b = 0; b < n_out / 32; b++) {
    const uint16_t *w = wb + b * k_in * 32;
    for (int64_t r = 0; r < rows; r += 2) {
      const int two = r + 1 < rows;
      const float *x0 = x + r * k_in, *x1 = two ? x0 + k_in : x0;
      v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
      for (int64_t k = 0; k < k_in; k++) {
        v8f w0, w1, w2, w3;
        widen16(w + k * 32, &w0, &w1);
        widen16(w + k * 32 + 16, &w2, &w3);
        const float s0 = x0[k], s1 = x1[k];
        a0 += w0 * s0; a1 += w1 * s0; a2 += w2 * s0; a3 += w3 * s0;
        c0 += w0 * s1; c1 += w1 * s1; c2 += w2 * s1; c3 += w3 * s1; }
      v8f bb[4]; memcpy(bb, bias + b * 32, sizeof bb);
      v8f out0[4] = {a0 + bb[0], a1 + bb[1], a2 + bb[2], a3 + bb[3]};
      memcpy(y + r * n_out + b * 32, out0, sizeof out0);
      if (two) {
        v8f out1[4] = {c0 + bb[0], c1 + bb[1], c2 + bb[2], c3 + bb[3]};
        memcpy(y + (r + 1) * n_out + b * 32, out1, sizeof out1); } } } }
"""
# -ffp-contract=off: no FMA but the ones written, so every rounding is the one torch makes
_FLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off", "-fPIC", "-shared")


def _target_flag() -> str:
    """This CPU's instructions, or AVX2 where torch is told to stop there
    (``ATEN_CPU_CAPABILITY=avx2``, as the AVX2-only emulation runs)."""
    capped = os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2"
    return "-march=x86-64-v3" if capped and platform.machine() == "x86_64" else "-march=native"
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _cache_dir() -> Path:
    """Where compiled kernels are kept between runs."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "sfbus"


def _compiler() -> str:
    """The C compiler: ``$CC``, else ``cc``."""
    return os.environ.get("CC", "cc")


def _build_key() -> str:
    """What the compiled code depends on: the source, the flags, the compiler, this CPU."""
    try:
        cpu = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("flags")), "")
    except OSError:
        cpu = ""
    text = "\n".join([_SOURCE, *_FLAGS, _target_flag(), _compiler(), platform.machine(),
                      cpu])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _compile(target: Path) -> None:
    """Compile the kernels into ``target``, atomically: processes may race to it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source, built = Path(tmp) / "kernels.c", Path(tmp) / target.name
        source.write_text(_SOURCE)
        subprocess.run([_compiler(), *_FLAGS, _target_flag(), str(source), "-o", str(built),
                        "-lm"], check=True, capture_output=True, timeout=120)
        os.replace(built, target)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None where they cannot be built."""
    if platform.system() != "Linux":  # libmvec is glibc's
        return None
    target = _cache_dir() / f"kernels-{_build_key()}.so"
    try:
        if not target.exists():
            _compile(target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("torch's ops run instead of sfbus's C kernels, which could not be built: %s",
                 exc)
        return None


def runs_on(*tensors: Tensor) -> bool:
    """Whether the kernels take these tensors: on CPU, float32 or bfloat16 alike, dense in the
    same strides, torch on one thread (with more, its own ops run in parallel), outside tracing
    and compiling (exported graphs keep torch's ops), and the kernels built."""
    x = tensors[0]
    return (x.device.type == "cpu" and x.dtype in _SUFFIX and torch.get_num_threads() == 1
            and all(t.dtype == x.dtype and t.stride() == x.stride() and _dense(t)
                    for t in tensors) and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling() and library() is not None)


def _dense(x: Tensor) -> bool:
    """Whether ``x``'s elements fill its storage in order, contiguous or channels-last."""
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(
        memory_format=torch.channels_last))


def _pointer(x: Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(x.data_ptr())


def elu(x: Tensor) -> Tensor:
    """ELU (alpha 1) of ``x``, for which :func:`runs_on` holds."""
    out = torch.empty_like(x)
    getattr(library(), f"elu_{_SUFFIX[x.dtype]}")(_pointer(x), _pointer(out),
                                                  ctypes.c_int64(x.numel()))
    return out


def elu_backward(grad: Tensor, x: Tensor) -> Tensor:
    """ELU's input gradient from ``grad`` and the input ``x`` (:func:`runs_on` both)."""
    out = torch.empty_like(x)
    getattr(library(), f"elu_backward_{_SUFFIX[x.dtype]}")(
        _pointer(grad), _pointer(x), _pointer(out), ctypes.c_int64(x.numel()))
    return out


def normalize_frames(frames: Tensor, scale_hwc: Tensor, offset_hwc: Tensor, clip: float,
                     dtype: torch.dtype, threads: int = 1) -> Tensor:
    """uint8 frames ``[..., C, H, W]`` (CPU) mapped per pixel to ``clip(frames * scale +
    offset)`` by float32 factors ``[H, W, C]``, rounded to ``dtype`` (float32 or bfloat16): a
    ``[..., C, H, W]`` view of channels-last values. Frames whose leading rows are each
    contiguous (a learner batch's ``[B, T]`` steps of ``[B, T + 1]``) are read where they lie,
    the rows spread over ``threads`` threads."""
    channels = scale_hwc.shape[-1]
    pixels = scale_hwc.numel() // channels
    count = frames.numel() // scale_hwc.numel()
    out = torch.empty((count, *scale_hwc.shape), dtype=dtype)
    flat = out.view(count, -1)
    kernel = getattr(library(), f"normalize_frames_{_SUFFIX[dtype]}")
    if frames.is_contiguous() or frames.dim() < 5 or not frames[0].is_contiguous():
        rows = [frames.contiguous().reshape(count, -1)]
    else:
        rows = list(frames.reshape(frames.shape[0], -1, *frames.shape[-3:]))

    def normalize(first: int, last: int) -> None:
        frame = sum(r.numel() for r in rows[:first]) // scale_hwc.numel()
        for row in rows[first:last]:
            n = row.numel() // scale_hwc.numel()
            kernel(_pointer(row), _pointer(scale_hwc), _pointer(offset_hwc), ctypes.c_int64(n),
                   ctypes.c_int64(channels), ctypes.c_int64(pixels), ctypes.c_float(clip),
                   _pointer(flat[frame]))
            frame += n

    shares = max(1, min(threads, len(rows)))
    if shares == 1:
        normalize(0, len(rows))
    else:
        bounds = [len(rows) * i // shares for i in range(shares + 1)]
        run_together([functools.partial(normalize, a, b) for a, b in itertools.pairwise(bounds)])
    return out.reshape(*frames.shape[:-3], *scale_hwc.shape).movedim(-1, -3)


BF16_BLOCK = 32
"""Outputs per block of :func:`pack_bf16_weights`' layout: its rows are padded to a multiple."""


def pack_bf16_weights(weight: Tensor) -> Tensor:
    """A linear layer's ``weight [N, K]`` rounded to bfloat16 in :func:`linear_bf16_weights`'
    layout (the outputs padded with zeros to a multiple of :data:`BF16_BLOCK`)."""
    n, k = weight.shape
    source = weight.detach().float().contiguous()
    out = torch.empty(-(-n // BF16_BLOCK) * BF16_BLOCK * k, dtype=torch.int16)
    library().pack_bf16_weights(_pointer(source), ctypes.c_int64(n), ctypes.c_int64(k),
                                _pointer(out))
    return out


def linear_bf16_weights(x: Tensor, packed: Tensor, bias: Tensor) -> Tensor:
    """``x [R, K] @ W^T + bias`` in float32 over :func:`pack_bf16_weights`' ``packed`` W, for
    ``x`` on which :func:`runs_on` holds; ``bias`` float32, padded as the weights (so is the
    result's width: slice it)."""
    rows, k = x.shape
    source = x.float().contiguous()
    out = torch.empty(rows, bias.numel())
    library().linear_bf16_weights(_pointer(source), _pointer(packed), _pointer(bias),
                                  _pointer(out), ctypes.c_int64(rows), ctypes.c_int64(k),
                                  ctypes.c_int64(bias.numel()))
    return out
