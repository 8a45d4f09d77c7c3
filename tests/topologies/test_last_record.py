"""The run's last progress record holds every frame the rollout workers stepped: each sends its
unreported frames as it stops, and the statistics actor writes the record after them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.short_runs import records

pytestmark = pytest.mark.multiprocess
ROOT = Path(__file__).parents[2]

# CartPole whose envs take 0.2 s each to close, so that a worker's stop (4 envs: 0.8 s) ends
# well after the statistics actor's process got its Stop too: a last record written without
# waiting for the workers' last reports would miss them.
SLOW_CLOSE = textwrap.dedent('''
    import time

    from gymnasium.envs.classic_control import CartPoleEnv


    class SlowCloseCartPole(CartPoleEnv):
        def close(self):
            time.sleep(0.2)
            super().close()
''')


@pytest.mark.timeout(120)
def test_the_last_record_holds_the_frames_stepped_since_the_workers_last_reports(
        tmp_path: Path) -> None:
    (tmp_path / "slow_close.py").write_text(SLOW_CLOSE)
    run_dir = tmp_path / "run"
    # Two workers in processes of their own that report only as they stop (every 60 s else,
    # past the run's end): whatever the last record holds came from their last reports.
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(ROOT / "topologies" / "cartpole.yaml"),
         "--run-dir", str(run_dir), "--max-frames", "3000", "--max-seconds", "90",
         "--set", "env=slow_close:SlowCloseCartPole", "--set", "num_envs=4",
         "--set", "batch_size=256", "--set", "processes.rollout.replicas=2",
         "--set", "progress_interval_s=60"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reached --max-frames 3000" in done.stderr, done.stderr[-3000:]
    assert "no last progress report" not in done.stderr, done.stderr[-3000:]
    # the run stopped once the workers had stepped 3,000 frames: the last record has them all
    assert records(run_dir)[-1]["env_frames"] >= 3000


@pytest.mark.timeout(120)
def test_in_serial_mode_the_last_record_holds_the_workers_last_reports(tmp_path: Path) -> None:
    # One loop: the host stops the rollout process's workers before the learner process's
    # statistics actor, whose last record then counts their last reports (the only ones here).
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(ROOT / "topologies" / "cartpole.yaml"),
         "--serial", "--run-dir", str(run_dir), "--max-frames", "3000", "--max-seconds", "90",
         "--set", "num_envs=4", "--set", "batch_size=256", "--set", "progress_interval_s=60"],
        cwd=tmp_path, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    last = records(run_dir)[-1]
    assert last["env_frames"] >= 3000 and last["time"] < 60, last  # stopped by --max-frames
