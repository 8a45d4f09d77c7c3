"""Whole runs through ``sfbus run``: exact results, restarts after SIGKILL, clean exits."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sfbus import Actor, ArraySpec
from sfbus.procfs import run_children
from tests.kernel.runs import segments_of, start_run, wait_for

pytestmark = pytest.mark.multiprocess

SUM_DEMO = Path(__file__).parents[2] / "topologies" / "sum_demo.yaml"
ENDLESS = """
settings: {count: %d}
processes:
  sender: {actors: {sender: {class: tests.kernel.test_flood:FloodSender}}}
  receiver:
    actors:
      receiver: {class: tests.kernel.test_flood:FloodReceiver}
      holder: {class: tests.kernel.test_run:Holder}
connections:
  - {from: sender.sent, to: receiver.on_sent}
"""


class Holder(Actor):
    """Owns a shared array, so that the clean-up checks have a segment to look for."""

    @classmethod
    def shared_arrays(cls, name: str, params: object, topology: object,
                      records: object) -> list[ArraySpec]:
        """One small array."""
        return [ArraySpec(f"{name}.data", (1024,), "float32")]


def array_segments(pid: int) -> list[str]:
    """The run's array segments (not its liveness lock)."""
    return [n for n in segments_of(pid) if not n.endswith(".lock")]


def test_ctrl_c_leaves_no_process_segment_or_socket(tmp_path: Path) -> None:
    topology = tmp_path / "endless.yaml"
    topology.write_text(ENDLESS % 10**9)
    run_dir = tmp_path / "run"
    run = start_run(topology, run_dir)
    try:
        wait_for(lambda: len(run_children(run_dir)) == 2, 30, "both processes to run")
        # the run's segments exist, so that their absence after the run means something
        wait_for(lambda: array_segments(run.pid), 10, "the run's segments")
        manifest = json.loads((run_dir / "run.json").read_text())
        sock_dir = Path(manifest["sock_dir"])
        wait_for(lambda: (sock_dir / "receiver.ipc").exists(), 10, "the receiver's socket")
        assert stat.S_IMODE(sock_dir.stat().st_mode) == 0o700  # sockets private to the user
        run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 130, err[-3000:]
    assert run_children(run_dir) == {}
    assert segments_of(run.pid) == []
    assert not sock_dir.exists()


def test_killed_launcher_takes_children_and_clean_removes_its_memory(tmp_path: Path) -> None:
    topology = tmp_path / "endless.yaml"
    topology.write_text(ENDLESS % 10**9)
    run_dir = tmp_path / "run"
    run = start_run(topology, run_dir, "--set", "run.heartbeat_interval_s=0.2")
    try:
        wait_for(lambda: len(run_children(run_dir)) == 2, 30, "both processes to run")
        wait_for(lambda: (run_dir / "run.json").exists(), 10, "the manifest")
        assert array_segments(run.pid)
    finally:
        run.kill()
        run.communicate()
    wait_for(lambda: run_children(run_dir) == {}, 10, "children to die with the launcher")
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
