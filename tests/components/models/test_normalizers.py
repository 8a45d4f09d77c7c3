"""Running mean/std normalizers: exact statistics, clipping and state_dict round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sfbus_components.models import native
from sfbus_components.models.normalizers import ObsNormalizer, ReturnsNormalizer, RunningMeanStd


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=6),
    seed=st.integers(0, 2**31 - 1),
)
def test_running_stats_equal_numpy_over_concatenated_batches(sizes, seed):
    rng = np.random.default_rng(seed)
    batches = [rng.normal(loc=3.0, scale=5.0, size=(n, 2, 3)) for n in sizes]
    rms = RunningMeanStd((3,))
    for batch in batches:
        rms.update(torch.from_numpy(batch).float())
    data = np.concatenate([b.astype(np.float32).astype(np.float64) for b in batches]).reshape(-1, 3)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-9, atol=1e-9)
    assert rms.count.item() == data.shape[0]


def test_image_statistics_equal_numpy_across_chunks():
    # uint8 moments come from float32 sums in chunks of 258 rows: 700 frames make three
    frames = torch.randint(0, 256, (700, 2, 3), dtype=torch.uint8)
    frames[:, 0, 0] = 9  # a pixel that never changes has variance 0 exactly
    rms = RunningMeanStd((2, 3), scale=1 / 255)
    rms.update(frames[:100])
    rms.update(frames[100:])
    pixels = frames.numpy().astype(np.float64) / 255
    np.testing.assert_allclose(rms.mean.numpy(), pixels.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), pixels.var(0), rtol=1e-9, atol=1e-15)
    assert rms.var[0, 0].item() == 0.0


def test_normalize_clips_and_denormalize_inverts():
    rms = RunningMeanStd((), clip=2.0)
    rms.update(torch.tensor([0.0, 2.0, 4.0, 6.0]))  # mean 3, var 5
    x = torch.tensor([3.0, 3.0 + 5**0.5, 100.0, -100.0])
    torch.testing.assert_close(rms.normalize(x), torch.tensor([0.0, 1.0, 2.0, -2.0]))
    torch.testing.assert_close(rms.denormalize(rms.normalize(x[:2])), x[:2])
    assert rms.mean.dtype == torch.float64


def test_state_dict_round_trip():
    rms = ReturnsNormalizer()
    rms.update(torch.randn(50) * 7 + 2)
    copy = ReturnsNormalizer()
    copy.load_state_dict(rms.state_dict())
    assert set(rms.state_dict()) == {"mean", "var", "count"}
    for key, value in rms.state_dict().items():
        assert torch.equal(copy.state_dict()[key], value)
    x = torch.randn(10)
    torch.testing.assert_close(copy.normalize(x), rms.normalize(x))


def test_obs_normalizer_normalizes_images_per_pixel_and_updates_only_in_training():
    spec = {"obs": ((3, 4, 4), "uint8"), "measurements": ((2,), "float32")}
    norm = ObsNormalizer(spec)
    image = torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8)
    image[:, 0] = 77  # a channel that never changes maps to 0
    measurements = torch.randn(5, 2) * 10 + 4
    out = norm({"obs": image, "measurements": measurements})
    assert out["obs"].dtype == torch.float32
    pixels = image.double() / 255
    expected = (pixels - pixels.mean(0)) / torch.sqrt(pixels.var(0, unbiased=False) + 1e-5)
    torch.testing.assert_close(out["obs"].double(), expected.clamp(-5, 5), rtol=1e-4, atol=1e-4)
    assert out["obs"][:, 0].abs().max() < 1e-4
    mean, std = measurements.double().mean(0), measurements.double().std(0, unbiased=False)
    torch.testing.assert_close(
        out["measurements"].double(), (measurements - mean) / std, rtol=1e-4, atol=1e-4
    )
    norm.eval()
    norm({"obs": image, "measurements": measurements + 100})
    assert norm.stats["measurements"].count.item() == 5
    assert norm.stats["obs"].count.item() == 5
    restored = ObsNormalizer(spec)
    restored.load_state_dict(norm.state_dict())
    torch.testing.assert_close(restored.stats["measurements"].mean, mean)
    torch.testing.assert_close(restored.stats["obs"].mean, pixels.mean(0))


@pytest.mark.parametrize("clip", [1.0, 5.0])
def test_clip_is_configurable(clip):
    rms = RunningMeanStd((), clip=clip)
    rms.update(torch.tensor([0.0, 1.0]))
    assert rms.normalize(torch.tensor([1e6])).item() == pytest.approx(clip)


def test_image_normalization_follows_statistics_copied_in_place():
    # inference workers copy new statistics into the buffers (read_into): the cached per-pixel
    # scale and offset must not outlive them
    norm = ObsNormalizer({"obs": ((2, 3), "uint8")}).eval()
    stats = norm.stats["obs"]
    frame = torch.randint(0, 256, (4, 2, 3), dtype=torch.uint8)

    def expected() -> torch.Tensor:
        std = torch.sqrt(stats.var + ObsNormalizer.IMAGE_EPS)
        return ((frame.double() / 255 - stats.mean) / std).clamp(-5, 5).float()

    first = norm({"obs": frame})["obs"]
    torch.testing.assert_close(first, expected())
    with torch.no_grad():
        stats.mean.copy_(torch.rand(2, 3, dtype=torch.float64))
        stats.var.copy_(torch.rand(2, 3, dtype=torch.float64) * 0.1)
    second = norm({"obs": frame})["obs"]
    torch.testing.assert_close(second, expected())
    assert not torch.equal(first, second)


def test_image_factors_refresh_in_place_for_replayed_graphs():
    # A CUDA graph captured the factors' tensors: a refresh must write into those very tensors,
    # including those an inference step made in inference mode; outside it, where such tensors
    # cannot be written, normalize makes new ones instead of failing.
    norm = ObsNormalizer({"obs": ((2, 3), "uint8")}).eval()
    stats = norm.stats["obs"]
    frame = torch.randint(0, 256, (4, 2, 3), dtype=torch.uint8)
    with torch.inference_mode():
        norm({"obs": frame})
    captured = [t.clone() for t in stats._affine()]
    tensors = stats._affine()
    with torch.no_grad():
        stats.mean.copy_(torch.rand(2, 3, dtype=torch.float64))
        stats.var.copy_(torch.rand(2, 3, dtype=torch.float64) * 0.1)
    with torch.inference_mode():
        norm.refresh_affine()
    assert all(now is before for now, before in zip(stats._affine_cache, tensors, strict=True))
    std = torch.sqrt(stats.var + ObsNormalizer.IMAGE_EPS)
    torch.testing.assert_close(tensors[0], (1 / 255 / std).float())
    torch.testing.assert_close(tensors[1], (-stats.mean / std).float())
    assert not torch.equal(tensors[0], captured[0])
    with torch.no_grad():
        stats.var.mul_(2)
    out = norm({"obs": frame})["obs"]  # outside inference mode
    expected = ((frame.double() / 255 - stats.mean) / torch.sqrt(stats.var + 1e-5)).float()
    torch.testing.assert_close(out, expected.clamp(-5, 5))
    assert stats._affine_cache[0] is not tensors[0]


def test_refresh_affine_makes_no_factors_for_keys_never_normalized():
    norm = ObsNormalizer({"obs": ((2, 3), "uint8"), "speed": ((2,), "float32")}).eval()
    norm.refresh_affine()
    assert all(not stats._affine_cache for stats in norm.stats.values())


def _image_stats(shape: tuple[int, ...]) -> RunningMeanStd:
    """Per-pixel statistics with random means and variances, as the learner has them."""
    stats = ObsNormalizer({"obs": (shape, "uint8")}).eval().stats["obs"]
    with torch.no_grad():
        stats.mean.copy_(torch.rand(shape, dtype=torch.float64))
        stats.var.copy_(torch.rand(shape, dtype=torch.float64) * 0.1)
    return stats


@pytest.mark.parametrize("frames", [4, 300])
def test_image_batches_of_any_size_normalize_to_the_same_values(frames):
    # from 256 frames on (at any size where the C kernel runs), normalize computes
    # channels-last and returns a [N, C, H, W] view
    stats = _image_stats((3, 4, 5))
    kernel = native.runs_on(stats._affine()[2])
    batch = torch.randint(0, 256, (frames, 3, 4, 5), dtype=torch.uint8)
    out = stats.normalize(batch)
    std = torch.sqrt(stats.var + ObsNormalizer.IMAGE_EPS)
    expected = ((batch.double() / 255 - stats.mean) / std).clamp(-5, 5).float()
    torch.testing.assert_close(out, expected)
    assert out.shape == batch.shape
    assert out.is_contiguous(memory_format=torch.channels_last) == (frames >= 256 or kernel)


@pytest.mark.parametrize("frames", [4, 300])
def test_images_normalize_into_bfloat16_as_float32_values_rounded(frames):
    # the learner asks for its encoder's dtype; a doom-sized frame makes the channels-last path
    # run in several chunks, the last one partial
    stats = _image_stats((3, 72, 128))
    batch = torch.randint(0, 256, (2, frames // 2 + 1, 3, 72, 128), dtype=torch.uint8)
    out, out32 = stats.normalize(batch, torch.bfloat16), stats.normalize(batch)
    assert out.dtype == torch.bfloat16 and out.shape == batch.shape
    assert torch.equal(out, out32.to(torch.bfloat16))
    std = torch.sqrt(stats.var + ObsNormalizer.IMAGE_EPS)
    expected = ((batch.double() / 255 - stats.mean) / std).clamp(-5, 5).float()
    # float32 rounding of offset + x * scale, whose terms reach hundreds for low-variance pixels
    torch.testing.assert_close(out32, expected, rtol=1e-4, atol=1e-4)


def test_normalize_input_keys_limit_the_running_statistics():
    spec = {"obs": ((3, 4, 4), "uint8"), "measurements": ((2,), "float32"),
            "goal": ((2,), "float32")}
    normalizer = ObsNormalizer(spec, keys=("measurements",))
    assert set(normalizer.stats) == {"measurements"}
    obs = {"obs": torch.full((5, 3, 4, 4), 7, dtype=torch.uint8),
           "measurements": torch.randn(5, 2) * 10 + 3, "goal": torch.randn(5, 2) * 10 + 3}
    out = normalizer.eval()(obs)
    assert torch.equal(out["goal"], obs["goal"]) and torch.equal(out["obs"], obs["obs"])
    assert ObsNormalizer(spec).stats.keys() == spec.keys()  # empty: every key
    with pytest.raises(ValueError, match=r"normalize_input_keys \['gaol'\]"):
        ObsNormalizer(spec, keys=("gaol",))
