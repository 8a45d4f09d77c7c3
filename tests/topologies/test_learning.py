"""Learning checks through the full multi-process system, judged by return per env frame.

Each run has the bound of its claim (frames) and stops at the first progress record that shows
the claim (tests/short_runs.py's run_until): a run that never shows it ends at the bound and
fails the test as before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.short_runs import records, run_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
TOPOLOGIES = Path(__file__).parents[2] / "topologies"


def _run(topology: str, run_dir: Path, *args: str, until: Callable[[list[dict]], bool],
         timeout: float = 270) -> str:
    """Run ``topology`` with ``args`` until ``until(progress records)`` holds or the run ends at
    its limits; its stderr."""
    code, err = run_until(TOPOLOGIES / topology, run_dir, *args,
                          reached=lambda: until(records(run_dir)), timeout=timeout)
    assert code in (0, 130), err[-3000:]  # 130: stopped here, gracefully
    return err


def _progress(run_dir: Path) -> list[dict]:
    return records(run_dir)


def _policy(record: dict) -> dict:
    return record["policies"].get("0", {})


@pytest.mark.timeout(300)  # above the run's own limit (270 s), so that one speaks first
def test_cartpole_reaches_195_over_100_episodes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    def over_100_episodes(records: list[dict]) -> list[tuple[float, int]]:
        return [(_policy(r).get("reward", 0.0), r["env_frames"]) for r in records
                if _policy(r).get("episodes", 0) >= 100]

    _run("cartpole.yaml", run_dir, "--max-frames", "150000", "--set", "report_every_s=0.5",
         until=lambda rs: any(reward >= 195 for reward, _ in over_100_episodes(rs)))
    best = max(over_100_episodes(_progress(run_dir)))
    assert best[0] >= 195, f"best 100-episode mean return {best[0]:.1f} within 150k frames"


@pytest.mark.timeout(300)
def test_short_doom_run_trains_and_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run("doom_basic.yaml", run_dir, "--max-frames", "40000", "--set", "num_envs=4",
         "--set", "batch_size=256", "--set", "report_every_s=0.5",
         until=lambda rs: any(_policy(r).get("version", 0) >= 3 and _policy(r).get("episodes")
                              for r in rs))
    record = _progress(run_dir)[-1]
    last = record["policies"]["0"]
    assert last["version"] >= 3
    # frames the learner trained on: whole agent steps of 4 frames, not more than were sampled
    # (give or take the one batch whose progress report may still be on its way)
    assert 0 < last["trained_frames"] <= record["env_frames"] + 256 * 4
    assert last["trained_frames"] % 4 == 0
    assert last["episodes"] > 0
    checkpoints = sorted((run_dir / "checkpoints" / "policy_0").glob("checkpoint_*.pt"))
    assert checkpoints, "no checkpoint written"


@pytest.mark.timeout(300)
def test_no_waiting_batch_trains_on_data_at_most_one_version_old(tmp_path: Path) -> None:
    """num_batches_to_accumulate 0: one slot per agent, so a batch holds trajectories started
    after the learner copied the one before, and collection pauses rather than deadlocks."""
    run_dir = tmp_path / "run"
    _run("cartpole.yaml", run_dir, "--max-frames", "40000", "--set", "batch_size=256",
         "--set", "num_batches_to_accumulate=0", "--set", "report_every_s=0.5",
         until=lambda rs: any(_policy(r).get("version", 0) >= 20 for r in rs))
    trained = [r["policies"]["0"] for r in _progress(run_dir)
               if "lag" in r["policies"].get("0", {})]
    assert trained and trained[-1]["version"] >= 20
    assert max(r["lag"] for r in trained) <= 1.0
