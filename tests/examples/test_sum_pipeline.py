"""The example pipeline of README: an exact total through real processes, even after kill -9."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest

from examples.sum_pipeline import expected_total
from sfbus.procfs import run_children
from tests.kernel.runs import segments_of, start_run, wait_for

pytestmark = pytest.mark.multiprocess

SUM_DEMO = Path(__file__).parents[2] / "topologies" / "sum_demo.yaml"


def test_sum_demo_is_exact(tmp_path: Path) -> None:
    run = start_run(SUM_DEMO, tmp_path / "run", "--set", "count=5000")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err[-3000:]
    result = json.loads((tmp_path / "run" / "sum_result.json").read_text())
    assert result == {"items": 5000, "total": expected_total(5000)}
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700
    assert segments_of(run.pid) == []


def test_killed_children_are_restarted_and_total_stays_exact(tmp_path: Path) -> None:
    # One run kills both, the producer and then the consumer once the producer runs again: each
    # is restarted and the total stays exact; a run killing the consumer alone repeats half of it.
    victims = ("producer", "consumer")
    count = 1_500_000
    run_dir = tmp_path / "run"
    run = start_run(SUM_DEMO, run_dir, "--set", f"count={count}", "--set",
                    "run.heartbeat_interval_s=0.2")
    try:
        for victim in victims:
            wait_for(lambda: len(run_children(run_dir)) == 2, 30, "both processes to run")
            time.sleep(0.5)  # let items flow before the kill
            os.kill(run_children(run_dir)[victim], signal.SIGKILL)
            wait_for(lambda v=victim: v in run_children(run_dir), 30, f"{victim} to restart")
        _out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 0, err[-3000:]
    result = json.loads((run_dir / "sum_result.json").read_text())
    assert result == {"items": count, "total": expected_total(count)}
    for victim in victims:
        assert f"process {victim} exited with code -9; restarting" in err
