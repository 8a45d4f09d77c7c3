"""Restart policies, the restart window, graceful-then-forced stops: real runs of tiny actors."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sfbus import Actor
from sfbus.procfs import run_children
from tests.kernel.runs import start_run, wait_for

pytestmark = pytest.mark.multiprocess


class Exiter(Actor):
    """Exits its process with ``code`` ``after_s`` after each start; ends the run at start
    ``stop_at`` (0: never)."""

    @dataclass(frozen=True)
    class Params:
        code: int = 3
        after_s: float = 0.3
        stop_at: int = 0

    async def on_start(self) -> None:
        """Count this start, then exit or end the run."""
        counter = Path(self.context.run_dir, "starts")
        starts = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(starts))
        if starts == self.params.stop_at:
            self.stop_run(f"start {starts}")
            return
        self.every(self.params.after_s, lambda: os._exit(self.params.code))


class SlowStopper(Actor):
    """Its on_stop takes a minute."""

    async def on_start(self) -> None:
        """Say it runs."""
        Path(self.context.run_dir, "running").touch()

    async def on_stop(self) -> None:
        """Hang."""
        await asyncio.sleep(60)


def _topology(tmp_path: Path, cls: str, restart: str = "always", run: str = "",
              params: str = "{}") -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(f"{run}\nprocesses:\n  p: {{restart: {restart}, actors: "
                    f"{{a: {{class: tests.kernel.test_policies:{cls}, params: {params}}}}}}}\n")
    return path


def test_restart_never_fails_the_run_at_the_first_exit(tmp_path: Path) -> None:
    run = start_run(_topology(tmp_path, "Exiter", "never"), tmp_path / "run")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 1, err[-3000:]
    assert "run failed: process p exited with code 3" in err
    assert "restarting" not in err


@pytest.mark.parametrize(("code", "outcome", "message"), [
    (0, 0, "run finished: process p exited with code 0"),
    (3, 1, "process p exited with code 3 and was restarted 1 times within 60 s; giving up"),
])
def test_restart_on_failure_restarts_failures_only(tmp_path: Path, code: int, outcome: int,
                                                   message: str) -> None:
    topology = _topology(tmp_path, "Exiter", "on-failure", "run: {max_restarts: 1}",
                         f"{{code: {code}}}")
    run = start_run(topology, tmp_path / "run")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == outcome, err[-3000:]
    assert message in err
    assert ("restarting" in err) == (code != 0)


def test_restarts_older_than_the_window_do_not_count(tmp_path: Path) -> None:
    # One restart allowed per 1 s window, a crash every ~1.5 s: five crashes, no give-up.
    topology = _topology(tmp_path, "Exiter", "always",
                         "run: {max_restarts: 1, restart_window_s: 1}",
                         "{after_s: 1.5, stop_at: 6}")
    run = start_run(topology, tmp_path / "run")
    _out, err = run.communicate(timeout=90)
    assert run.returncode == 0, err[-3000:]
    assert err.count("process p exited with code 3; restarting") == 5
    assert "a asked to stop: start 6" in err


def test_a_stop_that_hangs_is_forced_after_stop_timeout(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run = start_run(_topology(tmp_path, "SlowStopper", run="run: {stop_timeout_s: 2}"), run_dir)
    try:
        wait_for((run_dir / "running").exists, 30, "the run to start")
        run.send_signal(signal.SIGTERM)
        started = time.monotonic()
        _out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 1, err[-3000:]  # what it had not finished is lost
    assert 1.5 < time.monotonic() - started < 20
    assert re.search(r"process p did not stop within 2 s and was killed", err), err[-3000:]
    assert run_children(run_dir) == {}


def test_a_second_ctrl_c_forces_the_stop_at_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run = start_run(_topology(tmp_path, "SlowStopper", run="run: {stop_timeout_s: 60}"), run_dir)
    try:
        wait_for((run_dir / "running").exists, 30, "the run to start")
        run.send_signal(signal.SIGINT)
        time.sleep(1)  # the graceful stop is waiting for on_stop now
        run.send_signal(signal.SIGINT)
        started = time.monotonic()
        _out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 1, err[-3000:]  # forced: what it had not finished is lost
    assert time.monotonic() - started < 15  # not the 60 s stop timeout
    assert "second SIGINT: killing every process" in err
    assert "work was lost at stop: a second SIGINT killed p before its stop ended" in err
    assert run_children(run_dir) == {}
