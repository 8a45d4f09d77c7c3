"""Running mean / variance normalizers for observations and returns.

Statistics live in float64 buffers, so they travel in `state_dict` and can be copied into a
shared-memory parameter block like the weights. Stats are updated only in training mode (the
learner); inference workers keep their copy in `eval()` mode and only read it.

uint8 images are normalized per pixel, as Sample Factory's `normalize_input` does: scaled to
[0, 1], then (x - mean) / sqrt(var + 1e-5) per pixel and channel. The static background maps to
~0 and what moves (the monster in doom_basic) stands out; with a plain 1/255 scaling, doom_basic
did not learn at all in 110 updates (Sample Factory: mean reward 50 after ~85).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sfbus_components.models import native

# Frames from which a batch of images is normalized into a channels-last layout (see normalize):
# the learner's batches (~1000 frames) gain, inference's (8-32) lose to oneDNN's own reorder.
_CHANNELS_LAST_FROM = 256
# Values per chunk of that path: 1 MB of float32, so every pass after the first read stays in
# cache (1056 frames of 3x72x128 into bfloat16 on one thread, 2-core Xeon: 69 ms a batch in
# chunks of 256k values, 72 in chunks of 1M; the learner normalizes on one torch thread).
_CHUNK_VALUES = 1 << 18


class RunningMeanStd(nn.Module):
    """Mean and population variance over every sample seen, merged batch by batch
    (Chan et al.'s parallel form of Welford's algorithm).

    `scale` multiplies the inputs before anything else (1/255 for uint8 images, whose statistics
    are then in [0, 1] units); integer inputs are normalized into float32. A `frozen` one never
    updates: a fixed affine map `x * scale - mean` (with var 1, eps 0) for `obs_subtract_mean` /
    `obs_scale` without running normalization.
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(
        self, shape: tuple[int, ...] = (), clip: float = 5.0, eps: float = 1e-8, scale: float = 1.0,
        frozen: bool = False,
    ) -> None:
        super().__init__()
        self.frozen = frozen
        self.shape = tuple(shape)
        self.clip = clip
        self.eps = eps
        self.scale = scale
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self._affine_key: tuple[int, ...] = ()
        self._affine_cache: tuple[Tensor, ...] = ()

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merge the samples of `x [..., *shape]` into the running statistics (none when
        frozen)."""
        if self.frozen:
            return
        batch = x.detach().reshape(-1, *self.shape)
        if batch.dtype == torch.uint8:
            # Images: sums and sums of squares in float32, exact below 2^24 (hence at most
            # 2^24 / 255^2 rows per chunk), ~6x faster than var_mean's reduction across rows
            # (26 vs 4 ms for a learner's batch of 128 frames).
            for part in batch.split((1 << 24) // 255**2):
                values = part.float()
                mean = values.sum(0).double() / len(part)
                var = values.square_().sum(0).double() / len(part) - mean.square()
                self._merge(mean * self.scale, var * self.scale**2, len(part))
            return
        # Moments per chunk of ~4M values, merged exactly: a float64 copy of a whole big batch
        # would take hundreds of megabytes.
        rows = max(1, (1 << 22) // max(1, batch[:1].numel()))
        for part in batch.split(rows):
            var, mean = torch.var_mean(part.double(), dim=0, correction=0)
            # scale the moments, not the samples: one pass less over the batch
            self._merge(mean * self.scale, var * self.scale**2, len(part))

    def _merge(self, batch_mean: Tensor, batch_var: Tensor, n: int) -> None:
        total = self.count + n
        delta = batch_mean - self.mean
        # M2 = M2_a + M2_b + delta^2 n_a n_b / n
        m2 = self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: Tensor, dtype: torch.dtype = torch.float32, threads: int = 1) -> Tensor:
        """(x * scale - mean) / sqrt(var + eps), clipped to [-clip, clip]; in `x`'s dtype, or
        `dtype` for integer `x` (computed in float32 either way, then rounded); CPU frames on up
        to `threads` threads."""
        if not x.is_floating_point():
            # Images, on the hot paths of inference and the learner: float32 values, then the
            # affine map and the clip in place; no float64 temporaries. (An addcmul straight
            # from uint8 takes torch's slower mixed-dtype path: 16 frames of 3x72x128 into
            # bfloat16, 2-core Xeon, 0.68 against 0.55 ms, the same values.)
            scale, offset, scale_hwc, offset_hwc = self._affine()
            if len(self.shape) == 3 and x.dtype == torch.uint8 and x.device.type == "cpu" \
                    and dtype in (torch.float32, torch.bfloat16) and native.runs_on(scale_hwc):
                # one pass, channels-last at any batch size (the first convolution's fast
                # layout, which a separate copy cost more than it saved at inference's sizes)
                return native.normalize_frames(x, scale_hwc, offset_hwc, self.clip, dtype,
                                               threads)
            if len(self.shape) != 3 or x.numel() < _CHANNELS_LAST_FROM * scale.numel():
                values = x.float()
                return torch.addcmul(offset, values, scale, out=values).clamp_(
                    -self.clip, self.clip).to(dtype)
            return self._normalize_channels_last(x, dtype, scale_hwc, offset_hwc)
        std = torch.sqrt(self.var + self.eps)
        out = (x.to(torch.float64) * self.scale - self.mean) / std
        return out.clamp(-self.clip, self.clip).to(x.dtype)

    def _normalize_channels_last(self, x: Tensor, dtype: torch.dtype, scale_hwc: Tensor,
                                 offset_hwc: Tensor) -> Tensor:
        """A learner's batch of uint8 `[..., C, H, W]` frames normalized into `dtype` by the
        `[H, W, C]` factors, computed channels-last and returned as a `[..., C, H, W]` view: the
        layout oneDNN's convolutions want, so the encoder uses it as it is (~50 ms less of a
        1024-sample step)."""
        channels = self.shape[0]
        planes = x.reshape(-1, channels, scale_hwc[..., 0].numel())
        out = torch.empty((len(planes), *scale_hwc.shape), dtype=dtype, device=x.device)
        # Chunk by chunk while the chunk is in cache (whole-batch passes cost three round trips
        # through memory and took twice as long: 124 vs 62 ms for 1056 frames into bfloat16): the
        # uint8 channels interleaved one plane at a time straight into float32, then the addcmul
        # and clip in place, then the rounding copy. One strided copy per channel, not a
        # transposing copy of the frames (whose every read strides across the planes): 69 against
        # 102 ms a batch; into float32 rather than through an interleaved uint8 buffer: one pass
        # less, 55 -> 46 ms for 1056 frames of 3x72x128, 61 -> 50 of 4x84x84 into bfloat16
        # (2-core Xeon, medians of four interleaved pairs, the same values). A GPU has no cache
        # to fit and pays per kernel launch instead: one chunk.
        rows = max(1, _CHUNK_VALUES // scale_hwc.numel()) if x.device.type == "cpu" \
            else len(planes)
        work = None if dtype == torch.float32 else torch.empty(
            (rows, *scale_hwc.shape), device=x.device)
        for start in range(0, len(planes), rows):
            source, target = planes[start : start + rows], out[start : start + rows]
            part = target if work is None else work[: len(source)]
            pixels = part.view(len(source), planes.shape[2], channels)
            for channel in range(channels):
                pixels[:, :, channel].copy_(source[:, channel])
            torch.addcmul(offset_hwc, part, scale_hwc, out=part).clamp_(-self.clip, self.clip)
            if work is not None:
                target.copy_(part)
        return out.reshape(*x.shape[:-3], *scale_hwc.shape).movedim(-1, -3)

    def _affine(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """float32 ``scale / std`` and ``-mean / std``, then both with a 3-dim shape's first
        axis moved last (per-pixel image statistics as ``[H, W, C]``); recomputed only when the
        statistics changed: an inference worker normalizes every batch with statistics that
        change once per weights refresh (any in-place write, ``copy_`` included, bumps a
        tensor's version). A refresh on the same device writes into the tensors of the last one,
        so a CUDA graph that captured them reads the new factors (:meth:`refresh_affine`)."""
        key = (self.mean.data_ptr(), self.mean._version, self.var.data_ptr(), self.var._version)
        if key != self._affine_key:
            std = torch.sqrt(self.var + self.eps)
            scale, offset = (self.scale / std).float(), (-self.mean / std).float()
            last = (scale.movedim(0, -1).contiguous(), offset.movedim(0, -1).contiguous()) \
                if scale.dim() == 3 else (scale, offset)
            fresh = (scale, offset, *last)
            cache = self._affine_cache
            # (tensors made in inference mode can only be written in it)
            if cache and cache[0].device == scale.device and (
                    torch.is_inference_mode_enabled() or not cache[0].is_inference()):
                for cached, value in zip(cache, fresh, strict=True):
                    cached.copy_(value)
            else:
                self._affine_cache = fresh
            self._affine_key = key
        return self._affine_cache

    def refresh_affine(self) -> None:
        """Bring the image factors up to date with the statistics now, instead of at the next
        :meth:`normalize` (which a replayed CUDA graph does not run); no-op for other inputs."""
        if self._affine_cache:
            self._affine()

    def denormalize(self, x: Tensor) -> Tensor:
        """(x * sqrt(var + eps) + mean) / scale, the inverse of `normalize` (without the clip)."""
        std = torch.sqrt(self.var + self.eps)
        return ((x.to(torch.float64) * std + self.mean) / self.scale).to(x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        """Update the statistics with `x` in training mode, then normalize it."""
        if self.training:
            self.update(x)
        return self.normalize(x)


class ReturnsNormalizer(RunningMeanStd):
    """Scalar statistics of the value targets: the critic predicts returns in normalized space;
    V-trace / GAE run on denormalized values (Sample Factory's `normalize_returns`)."""

    def __init__(self, clip: float = 5.0, eps: float = 1e-8) -> None:
        super().__init__((), clip=clip, eps=eps)


class ObsNormalizer(nn.Module):
    """Normalizes every entry of an observation dict: float entries by their running statistics,
    uint8 images per pixel after scaling to [0, 1] (into float32; Sample Factory's eps 1e-5).

    ``keys`` (``normalize_input_keys``) limits the running statistics to those keys.
    ``running`` off (``normalize_input: false``): no statistics, entries pass unchanged, except
    the key ``obs`` under ``obs_subtract_mean`` / ``obs_scale`` (Sample Factory's, applied to
    ``obs`` as there): ``(x - subtract_mean) / scale``. With ``running`` on, ``obs_scale``
    replaces a uint8 image's 1/255 before the statistics (a constant shift they remove anyway).
    """

    IMAGE_EPS = 1e-5
    """Variance floor of an image pixel in [0, 1] units: a pixel that never changes maps to 0."""

    def __init__(self, obs_spec: dict[str, tuple[tuple[int, ...], str]], clip: float = 5.0,
                 running: bool = True, subtract_mean: float = 0.0, scale: float = 1.0,
                 keys: tuple[str, ...] = ()) -> None:
        super().__init__()
        unknown = sorted(set(keys) - set(obs_spec))
        if unknown:
            raise ValueError(f"normalize_input_keys {unknown}: no such observation key; the "
                             f"env has {sorted(obs_spec)}")
        stats: dict[str, RunningMeanStd] = {}
        for key, (shape, dtype) in obs_spec.items():
            affine = key == "obs" and (subtract_mean != 0.0 or scale != 1.0)
            if running and (not keys or key in keys):
                image = dtype == "uint8"
                factor = 1.0 / scale if affine else 1.0 / 255.0 if image else 1.0
                stats[key] = RunningMeanStd(tuple(shape), clip=clip,
                                            eps=self.IMAGE_EPS if image else 1e-8, scale=factor)
            elif affine:
                fixed = RunningMeanStd(tuple(shape), clip=float("inf"), eps=0.0,
                                       scale=1.0 / scale, frozen=True)
                fixed.mean.fill_(subtract_mean / scale)
                stats[key] = fixed
        self.stats = nn.ModuleDict(stats)

    def refresh_affine(self) -> None:
        """Every image key's factors brought up to date with its statistics now
        (:meth:`RunningMeanStd.refresh_affine`)."""
        for stats in self.stats.values():
            stats.refresh_affine()

    def forward(self, obs: dict[str, Tensor]) -> dict[str, Tensor]:
        """A new dict with every entry normalized (stats updated first in training mode)."""
        return {
            key: self.stats[key](value) if key in self.stats else value
            for key, value in obs.items()
        }
