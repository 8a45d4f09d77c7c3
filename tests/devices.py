"""The devices a device-dependent test runs on: the CPU always, a CUDA GPU where one is visible."""

from __future__ import annotations

import pytest
import torch

CUDA_MISSING = "needs a CUDA GPU: torch.cuda.is_available() is False on this machine"
CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA_MISSING)
"""Marks a test (or a parameter) that needs a CUDA GPU."""

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=CUDA_ONLY),
]
"""``pytest.mark.parametrize("device", DEVICES)``: CUDA cases skip, naming the missing GPU."""
