"""The live status line: its text, and how it renders on a real pseudo-terminal."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sfbus.rundir import RunLimits
from sfbus_components.monitoring.status import duration, human, progress_bar, status_line


def test_human_and_duration() -> None:
    assert [human(5), human(4321), human(1_234_567)] == ["5", "4.3k", "1.2M"]
    assert [duration(65), duration(3725)] == ["1:05", "1:02:05"]


def test_progress_bar_towards_frames_and_seconds() -> None:
    assert progress_bar(RunLimits(1000, None), 250, 10.0, 25.0) == (
        "[#####---------------]  25% 250/1.0k frames ETA 0:30")
    # with both limits, the one reached first decides (60 s here, frames would take 9 min)
    assert progress_bar(RunLimits(10_000, 60.0), 1000, 30.0, 20.0).endswith("0:30/1:00 ETA 0:30")
    assert progress_bar(RunLimits(), 1, 1.0, 1.0) == ""


def test_status_line_per_policy() -> None:
    line = status_line(2000, {"10s": 1500.0, "60s": 1400.0},
                       {"0": {"reward": 12.5, "version": 7, "lag": 1.25}, "1": {},
                        "2": {"reward": 3.0, "true_reward": 11.0}})
    assert line == ("2.0k frames | fps 1.5k (10s) 1.4k (60s) | p0 reward 12.50 v7 lag 1.2 | p1"
                    " | p2 reward 3.00 true 11.00")


def test_status_line_shows_the_env_metrics_asked_for() -> None:
    policies = {"0": {"reward": 1.0, "extra_stats": {"kills": 2.5, "deaths": 1.0}}, "1": {}}
    assert status_line(10, {}, policies, show_stats=("kills", "hits")) == (
        "10 frames | fps  | p0 reward 1.00 kills 2.50 | p1")
    assert "kills" not in status_line(10, {}, policies)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)  # above the run's own limit
def test_live_status_renders_on_a_terminal(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    run = subprocess.Popen(
        [sys.executable, "-m", "sfbus", "run", "topologies/cartpole.yaml", "--run-dir",
         str(tmp_path / "run"), "--max-frames", "15000", "--set", "num_envs=4"],
        stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
        cwd=Path(__file__).parents[3],
    )
    os.close(slave)
    screen = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: every writer exited
                break
            if not chunk:
                break
            screen += chunk
    finally:
        run.wait(timeout=120)
        os.close(master)
    assert run.returncode == 0, screen[-2000:]
    text = screen.decode(errors="replace")
    redraws = re.findall(r"\r\x1b\[2K(\[[#-]{20}\][^\r\n]*)", text)
    assert redraws, text[-2000:]
    assert re.search(r"frames ETA [0-9?:]+ \| fps \S+ \(10s\) \S+ \(60s\) \| p0", redraws[-1])
