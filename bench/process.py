"""Ending a benchmark's `sfbus run` subprocess the way a user would."""

from __future__ import annotations

import signal
import subprocess


def stop_gracefully(proc: subprocess.Popen) -> None:
    """SIGTERM (the supervisor then stops every process), SIGKILL if that takes over 60 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
