"""Supervision through real runs: silent processes, restart limits, metrics at one endpoint."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from sfbus import Actor
from sfbus.cli import main
from sfbus.procfs import run_children
from tests.kernel.runs import free_port, start_run, wait_for

pytestmark = pytest.mark.multiprocess


class Hanger(Actor):
    """Blocks its event loop the first time it runs (so it stops heart-beating)."""

    async def on_start(self) -> None:
        """Hang once: the marker file tells a restarted copy not to."""
        marker = Path(self.context.run_dir, "hung-once")
        if not marker.exists():
            marker.touch()
            self.every(0.1, lambda: time.sleep(3600))
        else:
            self.stop_run("came back after the hang")


class SlowStarter(Actor):
    """First start: runs, then the process dies; second: hangs in on_start; third: ends the
    run."""

    async def on_start(self) -> None:
        """Count the starts in the run directory and behave by the count."""
        counter = Path(self.context.run_dir, "starts")
        starts = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(starts))
        if starts == 1:
            self.every(0.5, lambda: os._exit(3))  # after the run started
            return
        if starts == 2:
            await asyncio.Event().wait()  # never started: the loop runs, heartbeats may too
        self.stop_run(f"started on try {starts}")


class Raiser(Actor):
    """A timer that raises once, then ends the run."""

    async def on_start(self) -> None:
        """Start the timer."""
        self.every(0.05, self._tick, "tick")

    def _tick(self) -> None:
        if not getattr(self, "raised", False):
            self.raised = True
            raise ValueError("on purpose")
        self.stop_run("raised once")


def test_a_slot_or_timer_that_raises_shows_in_the_runs_output(tmp_path: Path) -> None:
    # The phrase the real-run tests look for to say that no actor raised: their positive control.
    topology = _topology(tmp_path, "tests.kernel.test_supervision:Raiser")
    run = start_run(topology, tmp_path / "run")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err[-3000:]
    assert "a.tick raised ValueError('on purpose')" in err and " raised " in err


class Crasher(Actor):
    """Fails in on_start, every time."""

    async def on_start(self) -> None:
        """Fail."""
        raise RuntimeError("cannot start")


def _topology(tmp_path: Path, cls: str, run: str = "") -> Path:
    path = tmp_path / "t.yaml"
    actors = f"{{a: {{class: {cls}}}}}"
    path.write_text(f"{run}\nprocesses:\n  p: {{restart: always, actors: {actors}}}\n")
    return path


def test_silent_process_is_reported_killed_and_restarted(tmp_path: Path) -> None:
    topology = _topology(tmp_path, "tests.kernel.test_supervision:Hanger",
                         "run: {heartbeat_interval_s: 0.2, heartbeat_timeout_s: 2}")
    run = start_run(topology, tmp_path / "run")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err[-3000:]
    assert re.search(r"process p stopped heart-beating [0-9.]+ s ago; last activity: a ", err)
    assert "process p exited with code -9; restarting" in err
    assert "a asked to stop: came back after the hang" in err


def test_a_restarted_process_that_hangs_in_on_start_is_killed_after_start_timeout(
        tmp_path: Path) -> None:
    topology = _topology(tmp_path, "tests.kernel.test_supervision:SlowStarter",
                         "run: {start_timeout_s: 3, max_restarts: 3}")
    run = start_run(topology, tmp_path / "run")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err[-3000:]
    assert "process p exited with code 3; restarting" in err
    assert "process p did not start within start_timeout_s (3 s); killing it" in err
    assert "process p exited with code -9; restarting" in err
    assert "a asked to stop: started on try 3" in err


def test_sighup_stops_the_run_like_sigterm(tmp_path: Path) -> None:
    topology = _topology(tmp_path, "tests.kernel.test_flood:FloodReceiver")
    run_dir = tmp_path / "run"
    run = start_run(topology, run_dir)
    try:
        wait_for(lambda: (run_dir / "logs" / "p.log").exists(), 30, "the process to start")
        run.send_signal(signal.SIGHUP)
        _out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 130, err[-3000:]
    assert "SIGHUP: stopping gracefully" in err
    assert run_children(run_dir) == {}


class Blocker(Actor):
    """Blocks its event loop for good once started: SIGTERM can no longer reach its handler."""

    async def on_start(self) -> None:
        """Block from the first tick on."""
        Path(self.context.run_dir, "blocking").touch()
        self.every(0.1, lambda: time.sleep(3600))


def test_a_sigkilled_launcher_ends_children_whose_loop_is_blocked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topology = _topology(tmp_path, "tests.kernel.test_supervision:Blocker",
                         "run: {heartbeat_timeout_s: 600}")
    run_dir = tmp_path / "run"
    run = start_run(topology, run_dir)
    try:
        wait_for((run_dir / "blocking").exists, 30, "the run to start")
        time.sleep(0.5)  # the child's loop is blocked now
        child = run_children(run_dir)["p"]
        run.kill()
        run.wait(timeout=30)  # the launcher only: the orphan keeps the output pipes open
        # the run directory stays locked while any process of the run lives (checked in this
        # process: a new interpreter takes seconds to start, and the orphan lives 5 s)
        assert main(["run", "--resume", str(run_dir), "--max-seconds", "5"]) == 2
        assert "in use by another run" in capsys.readouterr().err
        assert "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]  # still running
        run.communicate(timeout=30)
        wait_for(lambda: not Path(f"/proc/{child}").exists()
                 or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2], 20,
                 "the orphaned child to die")
    finally:
        run.kill()
        for pid in run_children(run_dir).values():
            os.kill(pid, signal.SIGKILL)
    assert run_children(run_dir) == {}
    from sfbus.shm_cleanup import clean_stale_segments

    clean_stale_segments()  # what the next run does with the killed launcher's segments


def test_restart_limit_fails_the_run_naming_the_process(tmp_path: Path) -> None:
    topology = _topology(tmp_path, "tests.kernel.test_supervision:Crasher",
                         "run: {max_restarts: 2, restart_window_s: 60}")
    run = start_run(topology, tmp_path / "run")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 1
    assert err.count("RuntimeError: cannot start") >= 3
    assert ("process p exited with code 1 and was restarted 2 times within 60 s; giving up"
            in err)


def test_metrics_of_every_process_at_one_endpoint(tmp_path: Path) -> None:
    topology = tmp_path / "endless.yaml"
    topology.write_text(
        "settings: {count: 1000000000}\n"
        "processes:\n"
        "  sender: {actors: {sender: {class: tests.kernel.test_flood:FloodSender}}}\n"
        "  receiver: {actors: {receiver: {class: tests.kernel.test_flood:FloodReceiver}}}\n"
        "connections:\n  - {from: sender.sent, to: receiver.on_sent}\n")
    run_dir = tmp_path / "run"
    port = free_port()
    run = start_run(topology, run_dir, "--metrics-port", str(port))

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    def received() -> float:
        try:
            text = scrape()
        except OSError:
            return 0.0
        match = re.search(r'sfbus_bus_signals_received_total\{actor="receiver"\} (\S+)', text)
        return float(match.group(1)) if match else 0.0

    try:
        wait_for(lambda: received() > 0, 30, "received signals to be exported")
        first = received()
        wait_for(lambda: received() > first, 30, "the counter to grow")
        text = scrape()
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=30)
    finally:
        run.kill()
    assert re.search(r'sfbus_bus_signals_sent_total\{actor="sender"\} [1-9]', text)
    assert 'sfbus_bus_malformed_total{process="receiver"} 0.0' in text
    age = re.search(r'sfbus_supervisor_heartbeat_age_seconds\{process="receiver"\} (\S+)', text)
    # Beats come every second; a busy 2-core machine may delay one, but not by several.
    assert age is not None and 0.0 <= float(age.group(1)) < 5.0
    assert run_children(run_dir) == {}
