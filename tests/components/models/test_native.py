"""The C kernels (ELU, frame normalization): torch's values (every bfloat16 bit pattern of ELU,
float32 to a rounding or two), the same gradients, and torch's ops wherever they cannot run."""

from __future__ import annotations

import shutil

import pytest
import torch

from sfbus_components.models import native
from sfbus_components.models.elu import ELU, elu
from sfbus_components.models.native import library

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_torch_elu(monkeypatch):
    """Fail any call of torch's ELU: what passes ran the C kernels."""
    def refuse(*args, **kwargs):
        raise AssertionError("torch's ELU ran")
    monkeypatch.setattr(torch.nn.functional, "elu", refuse)


@needs_compiler
def test_every_bfloat16_value_is_torchs(one_thread, no_torch_elu):
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16)
    ours = elu(x)
    theirs = torch.ops.aten.elu(x)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0, equal_nan=True)


@needs_compiler
def test_float32_within_one_rounding_of_torch(one_thread, no_torch_elu):
    x = torch.cat([torch.linspace(-100, 100, 200_001), torch.tensor([0.0, -0.0, 1e-30, -1e-30,
                                                                     float("inf"), -float("inf")])])
    ours = elu(x)
    theirs = torch.ops.aten.elu(x)
    torch.testing.assert_close(ours, theirs, rtol=1.2e-7, atol=1e-38)


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gradients_are_torchs_in_channels_last_layers(one_thread, no_torch_elu, dtype):
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 32, 17, 31, generator=generator) * 3).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    grad = torch.randn(x.shape, generator=generator).to(dtype)
    ours_in = x.clone().requires_grad_()
    elu(ours_in).backward(grad)
    theirs_in = x.clone().requires_grad_()
    torch.ops.aten.elu(theirs_in).backward(grad)
    # float32: exp and the product each rounded once, torch's and ours apart
    exact = dict(rtol=0, atol=0) if dtype == torch.bfloat16 else dict(rtol=4e-7, atol=1e-38)
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, **exact)


@needs_compiler
def test_the_module_is_the_models_elu(one_thread, no_torch_elu):
    from sfbus_components.models.encoders import activation
    module = activation("elu")
    assert isinstance(module, ELU)
    x = torch.randn(8, 512).to(torch.bfloat16)
    torch.testing.assert_close(module(x), torch.ops.aten.elu(x), rtol=0, atol=0)


def test_torchs_elu_runs_without_a_compiler(monkeypatch, tmp_path, one_thread):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    library.cache_clear()
    try:
        assert library() is None
        x = torch.randn(5, 7, requires_grad=True)
        elu(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.where(x > 0, 1.0, torch.exp(x)).detach())
    finally:
        library.cache_clear()


@pytest.mark.parametrize("case", ["several threads", "strided", "float64"])
def test_torchs_elu_runs_where_the_kernels_do_not(monkeypatch, case):
    calls = []
    monkeypatch.setattr(torch.nn.functional, "elu",
                        lambda x: calls.append(x) or torch.ops.aten.elu(x))
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if case == "several threads" else 1)
    try:
        x = torch.randn(6, 8, dtype=torch.float64 if case == "float64" else torch.float32)
        elu(x[:, ::2] if case == "strided" else x)
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 1


@needs_compiler
@pytest.mark.parametrize("shape", [(3, 72, 128), (4, 84, 84), (2, 5, 7)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("frames", [1, 16, 300])
def test_frames_normalize_to_torchs_values_channels_last(monkeypatch, one_thread, shape, dtype,
                                                          frames):
    from sfbus_components.models.normalizers import RunningMeanStd
    generator = torch.Generator().manual_seed(frames)
    stats = RunningMeanStd(shape, clip=1.5, eps=1e-5, scale=1 / 255)
    stats.update(torch.randint(0, 256, (64, *shape), dtype=torch.uint8, generator=generator))
    stats.update(torch.randint(0, 40, (64, *shape), dtype=torch.uint8, generator=generator))
    x = torch.randint(0, 256, (frames, *shape), dtype=torch.uint8, generator=generator)
    ours = stats.normalize(x, dtype)
    assert ours.is_contiguous(memory_format=torch.channels_last)
    monkeypatch.setattr(native, "runs_on", lambda *tensors: False)
    theirs = stats.normalize(x, dtype)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert ours.abs().max() == 1.5  # the clip applied


@needs_compiler
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_batchs_steps_normalize_where_they_lie_over_threads(monkeypatch, one_thread, threads):
    """The learner's [B, T] steps of a [B, T + 1] batch: no copy of the slice, trajectories
    spread over threads, the values of one contiguous pass."""
    from sfbus_components.models.normalizers import RunningMeanStd
    generator = torch.Generator().manual_seed(threads)
    stats = RunningMeanStd((3, 6, 10), clip=2.0, eps=1e-5, scale=1 / 255)
    batch = torch.randint(0, 256, (5, 4, 3, 6, 10), dtype=torch.uint8, generator=generator)
    stats.update(batch.flatten(0, 1))
    copies = []
    contiguous = torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda x, *a, **k: copies.append(x.dtype)
                        or contiguous(x, *a, **k))
    ours = stats.normalize(batch[:, :3], torch.float32, threads)
    assert torch.uint8 not in copies and ours.shape == (5, 3, 3, 6, 10)
    whole = stats.normalize(contiguous(batch[:, :3]).flatten(0, 1), torch.float32)
    torch.testing.assert_close(ours.flatten(0, 1), whole, rtol=0, atol=0)


@needs_compiler
def test_avx2_capped_torch_gets_avx2_kernels_with_the_same_values(monkeypatch, tmp_path,
                                                                   one_thread, no_torch_elu):
    import platform
    if platform.machine() != "x86_64":
        pytest.skip("AVX2 is x86's")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    library.cache_clear()
    try:
        assert library() is not None
        assert [path.name for path in (tmp_path / "sfbus").iterdir()] == [
            f"kernels-{native._build_key()}.so"]
        assert native._target_flag() == "-march=x86-64-v3"
        x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
        torch.testing.assert_close(elu(x), torch.ops.aten.elu(x), rtol=0, atol=0, equal_nan=True)
    finally:
        library.cache_clear()


@needs_compiler
@pytest.mark.parametrize("capability", ["", "avx2"])
def test_every_elu_kernel_is_vectorized(monkeypatch, tmp_path, capability):
    """Each ELU loop calls glibc's vector exp: GCC leaves a loop scalar where it cannot
    if-convert it, silently (the AVX2 build's float32 backward once took 6 ns a value, not 0.6:
    a fifth of a float32 learner step)."""
    import platform
    import subprocess
    if platform.machine() != "x86_64" or shutil.which("objdump") is None:
        pytest.skip("checked on x86 with binutils' objdump")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    built = tmp_path / "kernels.so"
    native._compile(built)
    for kernel in ("elu_f32", "elu_bf16", "elu_backward_f32", "elu_backward_bf16"):
        code = subprocess.run(["objdump", "-d", f"--disassemble={kernel}", str(built)],
                              check=True, capture_output=True, text=True).stdout
        assert "call" in code and "_ZGV" in code, f"{kernel} is not vectorized"


@needs_compiler
@pytest.mark.parametrize(("out_features", "in_features"), [(64, 96), (37, 5)])
def test_a_linear_over_bfloat16_weights_is_float32_arithmetic_on_the_rounded_weights(
        one_thread, out_features, in_features):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(5, in_features, generator=gen)
    packed = native.pack_bf16_weights(weight)
    padded = torch.zeros(-(-out_features // native.BF16_BLOCK) * native.BF16_BLOCK)
    padded[:out_features] = bias  # the outputs past out_features (a block's tail) are sliced off
    ours = native.linear_bf16_weights(x, packed, padded)[:, :out_features]
    exact = x.double() @ weight.to(torch.bfloat16).double().T + bias.double()
    # float32 sums of exact products: ~1e-6 off, where the unrounded weights are ~1e-2 off
    torch.testing.assert_close(ours.double(), exact, rtol=1e-5, atol=1e-5)
    # every row the same bits whatever rows share its pass (two rows per read of the weights)
    for rows in (1, 2, 3):
        alone = torch.cat([native.linear_bf16_weights(x[i:i + rows], packed, padded)
                           for i in range(0, 5, rows)])[:, :out_features]
        assert torch.equal(alone, ours)


@needs_compiler
@pytest.mark.parametrize("capability", ["", "avx2"])
def test_the_bfloat16_weights_kernel_is_vectorized_with_fmas(monkeypatch, tmp_path, capability):
    """Its weights widen by interleaving with zeros and meet the inputs in FMAs: a scalar
    build would read them no faster than oneDNN reads float32."""
    import platform
    import subprocess
    if platform.machine() != "x86_64" or shutil.which("objdump") is None:
        pytest.skip("checked on x86 with binutils' objdump")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    built = tmp_path / "kernels.so"
    native._compile(built)
    code = subprocess.run(["objdump", "-d", "--disassemble=linear_bf16_weights", str(built)],
                          check=True, capture_output=True, text=True).stdout
    assert "vpunpcklwd" in code and "vpunpckhwd" in code and "vfmadd231ps" in code
