"""The statistics actor's env metrics: averaged per policy over the reward's episodes, bounded;
its frames on from a resumed checkpoint's; a worker's last report counted on one loop."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from sfbus import Actor, Signal
from sfbus_components.datapath.messages import EpisodeFinished, RolloutProgress, TrainingResumed
from sfbus_components.monitoring.stats import Stats
from sfbus_components.sampling.extra_stats import MAX_NAMES_PER_POLICY
from tests.kernel.conftest import hosted, make_topology


@pytest.fixture
async def stats():
    actor = Stats("stats", Stats.Params(report_every_s=3600.0, average_episodes=3, live="off",
                                        show_stats=("kills",)))
    await actor.on_start()
    yield actor
    await actor.on_stop()


def episode(policy: int, *extra: tuple[str, float]) -> EpisodeFinished:
    """An episode of return 1 reporting ``extra``."""
    return EpisodeFinished(policy, 1.0, 4, 4, extra_stats=extra)


async def test_averaged_per_policy_over_the_last_episodes(stats: Stats, caplog) -> None:
    for kills in (1.0, 2.0, 3.0, 4.0):  # the window holds the last 3, as the returns' does
        stats.on_episode_finished(episode(0, ("kills", kills), ("score", 10 * kills)))
    stats.on_episode_finished(episode(1, ("kills", 7.0)))
    assert stats._policy_record(0, stats.policies[0])["extra_stats"] == {"kills": 3.0,
                                                                        "score": 30.0}
    assert stats._policy_record(1, stats.policies[1])["extra_stats"] == {"kills": 7.0}
    with caplog.at_level(logging.INFO):
        stats.report()
    line = caplog.records[-1].getMessage()
    assert "| kills 3.00 |" in line and "score" not in line  # shown on request only
    assert "| kills 7.00" in line


async def test_names_beyond_the_bound_are_dropped_with_one_warning(stats: Stats, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        for n in range(MAX_NAMES_PER_POLICY + 5):
            stats.on_episode_finished(episode(0, (f"stat_{n}", 1.0)))
    assert len(stats.policies[0].extra) == MAX_NAMES_PER_POLICY
    record = stats._policy_record(0, stats.policies[0])
    assert f"stat_{MAX_NAMES_PER_POLICY - 1}" in record["extra_stats"]
    assert f"stat_{MAX_NAMES_PER_POLICY}" not in record["extra_stats"]
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        f"stats: policy 0's envs reported more than {MAX_NAMES_PER_POLICY} names of "
        f"episode_extra_stats: 'stat_{MAX_NAMES_PER_POLICY}' and later ones are dropped"]
    assert stats.policies[0].episodes == MAX_NAMES_PER_POLICY + 5  # every episode still counts


async def test_a_resumed_run_counts_on_from_its_checkpoint_but_not_in_the_rate(
        stats: Stats, caplog) -> None:
    stats.on_training_resumed(TrainingResumed(policy=0, env_frames=1_000_000))
    await asyncio.sleep(0.2)
    await stats.on_rollout_progress(RolloutProgress(worker=0, frames=500))
    with caplog.at_level(logging.INFO):
        stats.report()
    assert stats.frames == 1_000_500 and "frames 1,000,500 |" in caplog.records[-1].getMessage()
    # only the 500 collected in the >= 0.2 s since the start: at most 2,500 per second
    assert 0 < stats.fps(10.0) <= 2_500


class LastReport(Actor):
    """A rollout worker's stop: its last progress report, sent from ``on_stop``."""

    rollout_progress = Signal(RolloutProgress)

    async def on_stop(self) -> None:
        """Report the frames stepped since the previous report."""
        self.rollout_progress.emit(RolloutProgress(0, 96, final=True))


async def test_on_one_loop_a_workers_last_report_reaches_the_last_record_whatever_the_names(
        tmp_path: Path) -> None:
    # serial mode, the statistics' process named after the worker's: by name alone it stopped
    # first and wrote its last record without the worker's last frames
    topology = make_topology(
        {"rollout": {"rollout": "tests.components.monitoring.test_stats:LastReport"},
         "stats": {"stats": "sfbus_components.monitoring.stats:Stats"}},
        [("rollout.rollout_progress", "stats.on_rollout_progress", "broadcast")])
    async with hosted(topology, "inproc", run_dir=str(tmp_path)):
        pass
    records = (tmp_path / "progress.jsonl").read_text().splitlines()
    assert json.loads(records[-1])["env_frames"] == 96
