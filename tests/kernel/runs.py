"""Helpers for tests that start real runs with ``python -m sfbus run``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def start_run(topology: str | Path, run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """Start ``sfbus run`` in the background, its output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "sfbus", "run", str(topology), "--run-dir", str(run_dir), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for(condition, timeout: float, what: str) -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def segments_of(launcher_pid: int) -> list[str]:
    """Shared-memory segments created by the launcher with this pid."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"sfbus-{launcher_pid}-")]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
