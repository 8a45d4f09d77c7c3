"""The ``device`` setting: checked at validation, resolved per policy, on every device present."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sfbus_components.models.device import check_device, resolve_device
from tests.devices import CUDA_MISSING

HAS_CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("setting", ["gpu", "cuda:", "cuda:x", "CPU", "", "cuda:0:1"])
def test_malformed_settings_are_refused(setting: str) -> None:
    with pytest.raises(ValueError, match=r"device must be auto, cpu, cuda or cuda:N"):
        check_device(setting)


@pytest.mark.parametrize("setting", ["auto", "cpu"])
def test_auto_and_cpu_are_valid_anywhere(setting: str) -> None:
    check_device(setting)
    expected = "cuda" if setting == "auto" and HAS_CUDA else "cpu"
    assert resolve_device(setting).type == expected


@pytest.mark.skipif(HAS_CUDA, reason="checks the machine without a GPU; this one has one")
@pytest.mark.parametrize("setting", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_refused(setting: str) -> None:
    with pytest.raises(ValueError, match=r"no CUDA GPU is visible here"):
        check_device(setting)


@pytest.mark.skipif(not HAS_CUDA, reason=CUDA_MISSING)
def test_policies_spread_over_the_gpus() -> None:
    count = torch.cuda.device_count()
    assert [resolve_device("cuda", i).index for i in range(2 * count)] == [
        i % count for i in range(2 * count)]
    assert resolve_device("auto", 1).index == 1 % count
    assert resolve_device(f"cuda:{count - 1}", 0).index == count - 1
    with pytest.raises(ValueError, match=rf"this machine has {count} CUDA GPU"):
        check_device(f"cuda:{count}")


def test_validate_refuses_a_device_this_machine_lacks() -> None:
    # cuda:N past the last GPU is missing on every machine (N = 0 where there is none).
    missing = f"cuda:{torch.cuda.device_count() if HAS_CUDA else 0}"
    result = subprocess.run(
        [sys.executable, "-m", "sfbus", "validate", "topologies/cartpole.yaml", "--set",
         f"device={missing}"], capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"settings.device: device '{missing}'" in lines[0]
    assert "Traceback" not in result.stderr
