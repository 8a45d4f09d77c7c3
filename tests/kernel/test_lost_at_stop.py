"""The exit code tells the truth about work lost at stop: a run whose process could not finish
(its ``on_stop`` raised, it was killed at its stop timeout) ends with 1, never 0 or 130, and
its last line says what was lost."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from sfbus import Actor
from tests.kernel.runs import start_run, wait_for

pytestmark = pytest.mark.multiprocess


class Stopper(Actor):
    """Ends its stop as told: cleanly, raising, or hanging past any stop timeout."""

    @dataclass(frozen=True)
    class Params:
        on_stop: str = "clean"
        """``clean``, ``raise`` or ``hang``."""

    async def on_start(self) -> None:
        """Say it is up (a file beside the run)."""
        (Path(self.context.run_dir) / "started").touch()

    async def on_stop(self) -> None:
        """Do as told; say what it is at, as a learner does before its final checkpoint."""
        self.note("writing its final state; the newest written is state_7")
        if self.params.on_stop == "raise":
            raise OSError(28, "No space left on device")
        if self.params.on_stop == "hang":
            await asyncio.sleep(3600)


TOPOLOGY = """
run: {stop_timeout_s: 2}
processes:
  main:
    restart: never
    actors:
      stopper: {class: tests.kernel.test_lost_at_stop:Stopper, params: {on_stop: %s}}
"""


def _stop(tmp_path: Path, behaviour: str, how: signal.Signals | None) -> tuple[int, str]:
    """Run a Stopper, end the run by ``how`` (None: --max-seconds), return (code, stderr)."""
    topology = tmp_path / "t.yaml"
    topology.write_text(TOPOLOGY % behaviour)
    run_dir = tmp_path / "run"
    args = () if how else ("--max-seconds", "2")
    run = start_run(topology, run_dir, *args)
    try:
        wait_for(lambda: (run_dir / "started").exists(), 60, "the actor to start")
        if how:
            run.send_signal(how)
        _out, err = run.communicate(timeout=60)
    finally:
        run.kill()
    return run.returncode, err


def test_a_clean_stop_keeps_its_exit_code(tmp_path: Path) -> None:
    code, err = _stop(tmp_path, "clean", signal.SIGINT)  # ended by --max-seconds: 0 elsewhere
    assert code == 130, err[-2000:]
    assert "lost at stop" not in err


@pytest.mark.parametrize("how", [None, signal.SIGINT])
def test_an_on_stop_that_raises_fails_the_run_saying_what(tmp_path: Path, how) -> None:
    code, err = _stop(tmp_path, "raise", how)
    assert code == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "work was lost at stop: stopper.on_stop raised OSError" in last, last
    assert "No space left on device" in last


def test_a_process_killed_at_its_stop_timeout_fails_the_run_naming_what_it_was_at(
        tmp_path: Path) -> None:
    code, err = _stop(tmp_path, "hang", signal.SIGTERM)
    assert code == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "process main did not stop within 2 s and was killed" in last, last
    assert "the newest written is state_7" in last  # the actor's own note
