"""``sfbus run --serial``: every actor on one loop in one process, in a run directory of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from examples.sum_pipeline import expected_total

TOPOLOGIES = Path(__file__).parents[2] / "topologies"
ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.multiprocess


def serial_run(topology: str, run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``sfbus run --serial`` from the repository root, as the README shows it."""
    return subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGIES / topology), "--serial",
         "--run-dir", str(run_dir), *args],
        capture_output=True, text=True, timeout=90, cwd=ROOT)


def test_serial_sum_demo_finishes_with_its_result(tmp_path: Path) -> None:
    done = serial_run("sum_demo.yaml", tmp_path / "run")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "run" / "sum_result.json").read_text())
    assert result == {"items": 20_000, "total": expected_total(20_000)}
    for name in ("topology.yaml", "run.json", "logs"):
        assert (tmp_path / "run" / name).exists()


def test_serial_cartpole_trains_to_its_frame_limit_and_checkpoints(tmp_path: Path) -> None:
    done = serial_run("cartpole.yaml", tmp_path / "run", "--max-frames", "2000")
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "run" / "checkpoints" / "policy_0").glob("checkpoint_*.pt"))
    # a serial run's directory is a run's: a new run into it is refused, a --resume continues
    again = serial_run("cartpole.yaml", tmp_path / "run", "--max-frames", "2000")
    assert again.returncode == 2 and "holds a run already" in again.stderr, again.stderr
    resumed = serial_run("cartpole.yaml", tmp_path / "run", "--max-frames", "4000",
                         "--resume", str(tmp_path / "run"))
    assert resumed.returncode == 0, resumed.stderr
