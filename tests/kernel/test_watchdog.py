"""A run that stops advancing never looks healthy: a counted kind of progress that stands still
ends the run (exit 1) naming the actor and what it last did, and failures an actor's code keeps
having end its process once past the run's budget."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from sfbus import Actor
from tests.kernel.runs import start_run

pytestmark = pytest.mark.multiprocess


class Worker(Actor):
    """Counts ``things`` every 0.1 s until it has ``stall_at``, then only heart-beats."""

    @dataclass(frozen=True)
    class Params:
        stall_at: int = 10
        """Things counted before it stops advancing."""

    async def on_start(self) -> None:
        """Declare the kind and start counting."""
        self.report_advance("things", 0)
        self.every(0.1, self._tick)

    def _tick(self) -> None:
        if self._advances["things"] < self.params.stall_at:
            self.report_advance("things")
        else:
            self.note("waiting for a lock that never frees")


class Failing(Actor):
    """A timer that raises at every tick, which the kernel contains."""

    async def on_start(self) -> None:
        """Start the failing timer."""
        self.every(0.05, self._tick)

    def _tick(self) -> None:
        raise ValueError("broken every time")


def _run(tmp_path: Path, text: str) -> tuple[int, str]:
    topology = tmp_path / "t.yaml"
    topology.write_text(text)
    run = start_run(topology, tmp_path / "run", "--max-seconds", "60")
    try:
        _out, err = run.communicate(timeout=90)
    finally:
        run.kill()
    return run.returncode, err


def test_progress_that_stands_still_fails_the_run_naming_the_actor(tmp_path: Path) -> None:
    code, err = _run(tmp_path, """
run: {progress_timeout_s: 2}
processes:
  main:
    actors:
      worker: {class: tests.kernel.test_watchdog:Worker, params: {stall_at: 10}}
""")
    assert code == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "no progress: worker (process main) counted 10 things and no more for 2 s" in last
    assert "last activity: 'waiting for a lock that never frees'" in last


def test_progress_that_goes_on_is_left_alone(tmp_path: Path) -> None:
    topology = tmp_path / "t.yaml"
    topology.write_text("""
run: {progress_timeout_s: 2}
processes:
  main:
    actors:
      worker: {class: tests.kernel.test_watchdog:Worker, params: {stall_at: 1000000}}
""")
    run = start_run(topology, tmp_path / "run", "--max-seconds", "5")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err[-2000:]
    assert "no progress" not in err


def test_an_actor_past_its_failure_budget_ends_its_process(tmp_path: Path) -> None:
    code, err = _run(tmp_path, """
run: {max_actor_failures: 5}
processes:
  main:
    restart: never
    actors:
      failing: {class: tests.kernel.test_watchdog:Failing}
""")
    assert code == 1, err[-2000:]
    assert "6 failures within 300 s (run.max_actor_failures 5), the last in timer _tick: " \
           "ValueError('broken every time')" in err
    assert "process main exited with code 1" in err.strip().splitlines()[-1]
