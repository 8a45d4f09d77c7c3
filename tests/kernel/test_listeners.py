"""What a run listens on: the metrics endpoint binds only the address asked for (loopback by
default), and serving it beyond loopback is said at start."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.kernel.runs import free_port, listening, start_run, wait_for

pytestmark = pytest.mark.multiprocess

SUM_DEMO = Path(__file__).parents[2] / "topologies" / "sum_demo.yaml"


def _serve(tmp_path: Path, *sets: str) -> tuple[set[str], str]:
    """Start a long demo run serving metrics; the addresses it listens on and its output."""
    port = free_port()
    args = ["--metrics-port", str(port), "--set", "count=1000000000"]
    for text in sets:
        args += ["--set", text]
    run = start_run(SUM_DEMO, tmp_path / "run", *args)
    try:
        wait_for(lambda: listening(port), 60, "the metrics endpoint")
        addresses = listening(port)
        run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=60)
    finally:
        run.kill()
    return addresses, err


def test_metrics_listen_on_loopback_only_by_default(tmp_path: Path) -> None:
    addresses, err = _serve(tmp_path)
    assert addresses == {"127.0.0.1"}
    assert "beyond this machine's loopback" not in err


def test_metrics_beyond_loopback_listen_where_asked_and_say_so(tmp_path: Path) -> None:
    addresses, err = _serve(tmp_path, "run.metrics_host=0.0.0.0")
    assert addresses == {"0.0.0.0"}
    assert "metrics are served on 0.0.0.0, beyond this machine's loopback" in err
