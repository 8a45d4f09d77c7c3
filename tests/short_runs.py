"""Short real ``sfbus run``s of topologies/cartpole.yaml on a test env, for the tests that claim a
run learns, and runs stopped at the first evidence of what a test claims."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mean_rewards(run_dir: Path, env: str, frames: int, *sets: str, timeout: float,
                 stop_above: float | None = None) -> list[float]:
    """Run cartpole.yaml with ``env=ENV`` and ``sets`` to ``frames`` (stopped early once a
    record's mean reward passes ``stop_above``, if given); the 100-episode mean reward of each
    progress record that has episodes."""
    # seed 0 unless ``sets`` give one (a later --set wins): the learning claims were checked on
    # it, and a run given no seed draws one at random
    args = [a for s in (f"env={env}", "seed=0", *sets) for a in ("--set", s)]

    def passed() -> bool:
        return stop_above is not None and any(r > stop_above for r in _rewards(run_dir))

    code, err = run_until(ROOT / "topologies" / "cartpole.yaml", run_dir, "--max-frames",
                          str(frames), *args, reached=passed, timeout=timeout)
    assert code in (0, 130), err[-3000:]
    return _rewards(run_dir)


def _rewards(run_dir: Path) -> list[float]:
    return [r["policies"]["0"]["reward"] for r in records(run_dir)
            if r["policies"]["0"]["episodes"]]


def records(run_dir: Path, name: str = "progress.jsonl") -> list[dict]:
    """The whole JSON lines a run has written to ``name`` so far (a line still being written,
    with no newline yet, is left for the next read)."""
    path = run_dir / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def stderr_of(run_dir: Path) -> Path:
    """Where ``run_until`` writes the stderr of the run in ``run_dir``: beside it."""
    return run_dir.with_name(run_dir.name + ".stderr")


def run_until(topology: Path, run_dir: Path, *args: str, reached: Callable[[], bool],
              timeout: float) -> tuple[int, str]:
    """``sfbus run TOPOLOGY --run-dir RUN_DIR ARGS``, stopped with a Ctrl-C (SIGINT) as soon as
    ``reached()`` holds, else left to end at its own limits; its exit status and stderr (written
    as it comes to ``stderr_of(run_dir)``, which ``reached`` may read).

    A run stopped here exits 130 after its graceful stop (final records and checkpoints
    written), one that reached its limits 0: the tests that claim a run gets somewhere stop at
    the first evidence instead of training on to a bound picked for the slowest machine."""
    err_path = stderr_of(run_dir)
    with err_path.open("w") as err:  # a file, not a pipe: nobody has to drain it meanwhile
        run = subprocess.Popen(
            [sys.executable, "-m", "sfbus", "run", str(topology), "--run-dir", str(run_dir),
             *args], stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=ROOT)
        deadline = time.monotonic() + timeout
        try:
            while run.poll() is None and not reached():
                if time.monotonic() > deadline:
                    raise AssertionError(f"run still going after {timeout:g} s: "
                                         f"{err_path.read_text()[-3000:]}")
                time.sleep(0.2)
            if run.poll() is None:
                run.send_signal(signal.SIGINT)
            run.wait(timeout=max(deadline - time.monotonic(), 60))
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    return run.returncode, err_path.read_text()
