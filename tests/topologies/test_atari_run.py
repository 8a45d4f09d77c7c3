"""atari_breakout.yaml through the real CLI: a short run on ALE Breakout, and a bad game name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.short_runs import records, run_until

BREAKOUT = Path(__file__).parents[2] / "topologies" / "atari_breakout.yaml"


def sfbus(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`sfbus ARGS` in a child process, its output captured."""
    return subprocess.run([sys.executable, "-m", "sfbus", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)  # above the run's own limit, so that one speaks first
def test_short_breakout_run_steps_real_games_and_trains(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    def played_and_trained() -> bool:  # a record with whole games and a trained version
        found = records(run_dir)
        policy = found[-1]["policies"].get("0", {}) if found else {}
        return policy.get("episodes", 0) > 0 and policy.get("version", 0) >= 1

    # stopped (Ctrl-C) at the first record that shows it, reported each second; 8000 frames
    # stay its bound, a run that has not got there by then ends as before
    code, err = run_until(BREAKOUT, run_dir, "--max-frames", "8000", "--max-seconds", "240",
                          "--set", "num_envs=2", "--set", "batch_size=256",
                          "--set", "report_every_s=1", reached=played_and_trained, timeout=270)
    assert code in (0, 130), err[-3000:]
    assert " raised " not in err, err[-3000:]
    policy = records(run_dir)[-1]["policies"]["0"]
    assert policy["version"] >= 1  # the learner trained on Breakout's frames
    # whole games finished (5 lives each) and their raw score was reported beside the return
    assert policy["episodes"] > 0 and "true_reward" in policy
    assert policy["true_reward"] >= policy["reward"] >= 0


def test_an_unknown_game_is_a_located_error_before_anything_starts(tmp_path: Path) -> None:
    done = sfbus("run", str(BREAKOUT), "--run-dir", str(tmp_path / "run"),
                 "--set", "env=atari_nosuchgame", timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("error: ") and ".yaml:" in line
    assert "unknown env 'atari_nosuchgame'" in line
    assert not (tmp_path / "run").exists()
