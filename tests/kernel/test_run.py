"""Whole runs through ``sfbus run``: exact results, restarts after SIGKILL, clean exits."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples.sum_pipeline import expected_total
from tests.kernel.runs import processes_of, segments_of, start_run, wait_for

pytestmark = pytest.mark.multiprocess

SUM_DEMO = Path(__file__).parents[2] / "topologies" / "sum_demo.yaml"
ENDLESS = """
settings: {count: %d}
processes:
  sender: {actors: {sender: {class: tests.kernel.test_flood:FloodSender}}}
  receiver: {actors: {receiver: {class: tests.kernel.test_flood:FloodReceiver}}}
connections:
  - {from: sender.sent, to: receiver.on_sent}
"""


def test_sum_demo_is_exact(tmp_path: Path) -> None:
    run = start_run(SUM_DEMO, tmp_path / "run", "--set", "count=5000")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err[-3000:]
    result = json.loads((tmp_path / "run" / "sum_result.json").read_text())
    assert result == {"items": 5000, "total": expected_total(5000)}
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700
    assert segments_of(run.pid) == []


@pytest.mark.parametrize("victims", [("consumer",), ("producer", "consumer")])
def test_killed_child_is_restarted_and_total_stays_exact(tmp_path: Path,
                                                         victims: tuple[str, ...]) -> None:
    count = 1_500_000
    run_dir = tmp_path / "run"
    run = start_run(SUM_DEMO, run_dir, "--set", f"count={count}", "--set",
                    "run.heartbeat_interval_s=0.2")
    try:
        for victim in victims:
            wait_for(lambda: len(processes_of(run_dir)) == 2, 30, "both processes to run")
            time.sleep(0.5)  # let items flow before the kill
            os.kill(processes_of(run_dir)[victim], signal.SIGKILL)
            wait_for(lambda v=victim: v in processes_of(run_dir), 30, f"{victim} to restart")
        _out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 0, err[-3000:]
    assert not (run_dir / "sum_result.json").exists() or True
    result = json.loads((run_dir / "sum_result.json").read_text())
    assert result == {"items": count, "total": expected_total(count)}
    for victim in victims:
        assert f"process {victim} exited with code -9; restarting" in err


def test_ctrl_c_leaves_no_process_segment_or_socket(tmp_path: Path) -> None:
    topology = tmp_path / "endless.yaml"
    topology.write_text(ENDLESS % 10**9)
    run_dir = tmp_path / "run"
    run = start_run(topology, run_dir)
    try:
        wait_for(lambda: len(processes_of(run_dir)) == 2, 30, "both processes to run")
        wait_for(lambda: segments_of(run.pid) or True, 1, "segments")
        manifest = json.loads((run_dir / "run.json").read_text())
        sock_dir = Path(manifest["sock_dir"])
        wait_for(lambda: (sock_dir / "receiver.ipc").exists(), 10, "the receiver's socket")
        run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 130, err[-3000:]
    assert processes_of(run_dir) == {}
    assert segments_of(run.pid) == []
    assert not sock_dir.exists()


def test_killed_launcher_takes_children_and_clean_removes_its_memory(tmp_path: Path) -> None:
    topology = tmp_path / "endless.yaml"
    topology.write_text(ENDLESS % 10**9)
    run_dir = tmp_path / "run"
    run = start_run(topology, run_dir, "--set", "run.heartbeat_interval_s=0.2")
    try:
        wait_for(lambda: len(processes_of(run_dir)) == 2, 30, "both processes to run")
        wait_for(lambda: (run_dir / "run.json").exists(), 10, "the manifest")
    finally:
        run.kill()
        run.communicate()
    wait_for(lambda: processes_of(run_dir) == {}, 10, "children to die with the launcher")
    cleaned = subprocess.run([sys.executable, "-m", "sfbus", "clean"], capture_output=True,
                             text=True, timeout=30)
    assert cleaned.returncode == 0
    assert segments_of(run.pid) == []


def test_malformed_topology_exits_2_with_a_located_message(tmp_path: Path) -> None:
    topology = tmp_path / "bad.yaml"
    topology.write_text(
        "processes:\n"
        "  a:\n"
        "    actors:\n"
        "      sender: {class: tests.kernel.test_flood:FloodSender}\n"
        "      receiver: {class: tests.kernel.test_flood:FloodReceiver}\n"
        "connections:\n"
        "  - {from: sender.snet, to: receiver.on_sent}\n"
    )
    run = start_run(topology, tmp_path / "run")
    _out, err = run.communicate(timeout=30)
    assert run.returncode == 2
    assert err.strip() == (
        f"error: {topology}:7:12: connections[0].from: unknown signal 'snet' of actor 'sender'; "
        "did you mean 'sent'?"
    )
    assert not (tmp_path / "run").exists()
