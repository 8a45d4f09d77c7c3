"""The learner's checkpoint schedule: newest K, the best by a metric, milestones."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sfbus_components.datapath.messages import EpisodeFinished
from sfbus_components.learning import checkpoint_schedule
from sfbus_components.learning.checkpoint import list_checkpoints, load_checkpoint
from sfbus_components.learning.checkpoint_schedule import BEST_EPISODES, LearnerCheckpoints
from sfbus_components.learning.learner import Learner

PARAMS = Learner.Params(checkpoint_every_s=60.0, keep_checkpoints=2, save_best_after=1000,
                        save_best_every_s=5.0, save_milestones_s=0.0)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def episode(score: float, policy: int = 0, true_return: float = math.nan) -> EpisodeFinished:
    return EpisodeFinished(policy=policy, episode_return=score, length=10, frames=40,
                           true_return=true_return)


def test_best_follows_the_metric_after_its_frames_and_interval(tmp_path: Path) -> None:
    clock = Clock()
    keeper = LearnerCheckpoints(tmp_path, 0, PARAMS, clock)
    state = {"policy": {"w": torch.zeros(2)}}
    written = []
    # (time, env frames, episode scores arriving before the step) -> the metric sequence
    steps = [(1, 500, [10.0]), (2, 1000, [30.0]), (3, 2000, [80.0]), (8, 3000, [-50.0]),
             (14, 4000, [100.0, 100.0]), (20, 5000, [1.0] * BEST_EPISODES)]
    for version, (at, frames, scores) in enumerate(steps, 1):
        clock.now = at
        for score in scores:
            keeper.on_episode(episode(score))
        keeper.on_episode(episode(1e6, policy=1))  # another policy's episodes do not count
        kinds = keeper.due(frames)
        if kinds:
            keeper.write(state, version, kinds)
            written.append((version, kinds, keeper.best))
    # v1: before save_best_after; v2: first best (mean 20); v3: within 5 s of it; v4: the mean
    # fell (17.5); v5: mean 45 beats 20; v6: mean 1.0 is worse
    assert written == [(2, ("best",), 20.0), (5, ("best",), 45.0)]
    (best,) = list_checkpoints(tmp_path / "best")
    saved = load_checkpoint(best, required=("policy", "best"))
    assert best.name == "checkpoint_000000005.pt"
    assert saved["best"] == {"metric": "true_return", "score": 45.0}
    assert list_checkpoints(tmp_path) == []  # no periodic one was due


def test_true_return_is_the_metric_where_the_env_reports_it(tmp_path: Path) -> None:
    true = LearnerCheckpoints(tmp_path, 0, PARAMS, Clock())
    shaped = LearnerCheckpoints(tmp_path, 0, replace(PARAMS, save_best_metric="episode_return"),
                                Clock())
    for keeper in (true, shaped):
        keeper.on_episode(episode(5.0, true_return=1.0))
        keeper.on_episode(episode(7.0))  # no true return reported: the return stands in
    assert (true.metric(), shaped.metric()) == (4.0, 6.0)


def test_periodic_milestones_and_a_resumed_best(tmp_path: Path) -> None:
    clock = Clock()
    params = replace(PARAMS, save_milestones_s=100.0, save_best_metric="")
    keeper = LearnerCheckpoints(tmp_path, 0, params, clock)
    for version in range(1, 8):
        clock.now = 60.0 * version
        keeper.on_episode(episode(float(version)))
        kinds = keeper.due(10**6)
        assert "best" not in kinds  # save_best_metric "" turns it off
        if kinds:
            keeper.write({"policy": {}}, version, kinds)
    # periodic every 60 s, the newest 2 kept; milestones at 120, 240, 360 s, all kept
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_000000006.pt",
                                                           "checkpoint_000000007.pt"]
    assert [p.name for p in list_checkpoints(tmp_path / "milestones")] == [
        "checkpoint_000000002.pt", "checkpoint_000000004.pt", "checkpoint_000000006.pt"]
    assert not (tmp_path / "best").exists()

    resumed = LearnerCheckpoints(tmp_path, 0, PARAMS, Clock())
    resumed.restore({"best": {"metric": "true_return", "score": 42.0}})
    assert resumed.best == 42.0
    resumed.on_episode(episode(41.0))
    assert resumed.due(10**6) == ()  # the earlier best is better
    other_metric = LearnerCheckpoints(tmp_path, 0, PARAMS, Clock())
    other_metric.restore({"best": {"metric": "episode_return", "score": 42.0}})
    assert other_metric.best == -math.inf



def test_a_final_checkpoint_that_cannot_be_written_names_the_newest_that_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = LearnerCheckpoints(tmp_path / "policy_3", 3, PARAMS, Clock())
    assert schedule.newest() == "none"
    state = {"model": {"w": torch.zeros(2)}}
    written = schedule.write_final(state, version=7)
    assert schedule.newest() == str(written) and written.name == "checkpoint_000000007.pt"

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_schedule, "save_checkpoint", disk_full)
    with pytest.raises(RuntimeError, match=r"^policy 3: the final checkpoint could not be "
                                           r"written \(OSError: \[Errno 28\] No space left on "
                                           r"device\); the newest that exists is .*/policy_3/"
                                           r"checkpoint_000000007\.pt$"):
        schedule.write_final(state, version=8)


def test_the_best_never_gets_worse_across_a_crash_and_a_resume(tmp_path: Path) -> None:
    """A periodic checkpoint at score 20, then a best at 45, then a crash: the resumed learner
    restores the periodic state (its score 20) but must not write a best below 45."""
    clock = Clock()
    keeper = LearnerCheckpoints(tmp_path, 0, PARAMS, clock)
    state = {"policy": {"w": torch.zeros(2)}}
    keeper.best = 20.0
    periodic = keeper.write(state, 3, ("latest",))[0]
    for _ in range(2):
        keeper.on_episode(episode(45.0))
    clock.now = 10.0
    assert keeper.due(5000) == ("best",)
    keeper.write(state, 4, ("best",))

    resumed = LearnerCheckpoints(tmp_path, 0, PARAMS, Clock())  # after the crash
    resumed.restore(load_checkpoint(periodic, required=("policy", "best")))
    assert resumed.best == 45.0
    for _ in range(2):
        resumed.on_episode(episode(30.0))
    resumed.clock.now = 10.0
    assert resumed.due(6000) == ()  # 30 is worse than the best written
    (best,) = list_checkpoints(tmp_path / "best")
    assert load_checkpoint(best, required=("policy", "best"))["best"]["score"] == 45.0


def test_a_best_unreadable_at_start_is_read_again_before_a_worse_one_is_written(
        tmp_path: Path) -> None:
    """Found by bench.chaos: a learner restarted while its checkpoint folder was replaced by a
    file took no best score, and once the folder was back wrote a best below the one in it."""
    folder = tmp_path / "policy_0"
    keeper = LearnerCheckpoints(folder, 0, PARAMS, Clock())
    keeper.on_episode(episode(45.0))
    keeper.write({"policy": {"w": torch.zeros(2)}}, 5, ("best",))  # the best on disk: 45
    folder.rename(tmp_path / "away")
    folder.write_text("not a folder")
    restarted = LearnerCheckpoints(folder, 0, PARAMS, Clock())  # cannot read best/ now
    assert restarted.best == -math.inf
    folder.unlink()
    (tmp_path / "away").rename(folder)
    restarted.on_episode(episode(30.0))
    restarted.clock.now = 10.0
    assert restarted.due(6000) == ("best",)  # it cannot know yet
    restarted.write({"policy": {"w": torch.zeros(2)}}, 6, ("best",))
    (best,) = list_checkpoints(folder / "best")
    assert load_checkpoint(best, required=("policy", "best"))["best"]["score"] == 45.0
    assert restarted.best == 45.0
