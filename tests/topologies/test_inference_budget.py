"""An inference worker whose every pass raises is not contained for ever: each pass's failure
counts against the actor's budget, the process ends past it, and the run ends with exit 1 once the
restarts are spent (the rollout workers' re-sent requests kept it failing quietly before)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from sfbus_components.models import ModelConfig

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).parents[2]
HERE = "tests.topologies.test_inference_budget"


class FailsInInference(nn.Module):
    """An encoder that trains but raises in every inference pass (a user's part with a bug on the
    acting path only, so validation's probe and the learner see nothing wrong)."""

    def __init__(self, obs_spec: dict[str, tuple[tuple[int, ...], str]], cfg: ModelConfig) -> None:
        super().__init__()
        (size,) = obs_spec["obs"][0]
        self.out_size = 16
        self.layer = nn.Linear(size, self.out_size)

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        if torch.is_inference_mode_enabled():
            raise RuntimeError("broken on the acting path")
        return torch.tanh(self.layer(obs["obs"]))


def test_an_inference_pass_that_always_raises_ends_the_run(tmp_path: Path) -> None:
    # requests re-sent every 0.3-0.6 s: each incarnation spends its budget of 3 failures within a
    # second of its start, and the run ends after one restart
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(ROOT / "topologies" / "cartpole.yaml"),
         "--run-dir", str(tmp_path / "run"), "--max-seconds", "120",
         "--set", f"model.encoder={HERE}:FailsInInference", "--set", "run.max_actor_failures=3",
         "--set", "run.max_restarts=1", "--set", "inference_timeout_s=0.3"],
        capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the last in serve: RuntimeError('broken on the acting path')" in done.stderr, \
        done.stderr[-3000:]
    assert "process inference" in done.stderr.strip().splitlines()[-1], done.stderr[-3000:]
