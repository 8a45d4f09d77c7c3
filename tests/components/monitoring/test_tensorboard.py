"""The TensorBoard writer: a run per policy under Sample Factory's tags against env frames, read
back from the event files."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from sfbus import Actor, Signal
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology
from sfbus_components.datapath.messages import (
    TRAINING_FIGURES,
    EpisodeFinished,
    HyperparamsChanged,
    RolloutProgress,
    TrainingResumed,
    TrainingStats,
)
from sfbus_components.monitoring.tensorboard import TensorBoardWriter
from sfbus_components.sampling.extra_stats import MAX_NAMES_PER_POLICY
from tests.kernel.conftest import hosted


class Emitter(Actor):
    """Stands in for the rollout workers and the learner."""

    episode_finished = Signal(EpisodeFinished)
    rollout_progress = Signal(RolloutProgress)
    training_stats = Signal(TrainingStats)
    hyperparams_changed = Signal(HyperparamsChanged)
    training_resumed = Signal(TrainingResumed)


def topology(folder: str) -> Topology:
    """An emitter wired to a TensorBoard writer that only writes when told (long window)."""
    params = TensorBoardWriter.Params(report_every_s=3600.0, tensorboard_dir=folder)
    return Topology("tensorboard", "<test>", (
        ProcessSpec("emit", (ActorSpec("emitter",
                                       "tests.components.monitoring.test_tensorboard:Emitter",
                                       None),)),
        ProcessSpec("board", (ActorSpec("tensorboard",
                "sfbus_components.monitoring.tensorboard:TensorBoardWriter",
                                        params),)),
    ), tuple(ConnectionSpec("emitter", signal, "tensorboard", f"on_{signal}")
             for signal in ("episode_finished", "rollout_progress", "training_stats",
                            "hyperparams_changed", "training_resumed")))


def training_stats(policy: int, loss: float, env_frames: int = 256) -> TrainingStats:
    """A learner report with recognisable figures."""
    return TrainingStats(policy=policy, version=3, samples=64, env_frames=env_frames,
                         policy_loss=loss,
                         value_loss=0.25, entropy=0.6, kl=0.01, grad_norm=1.5, lr=1e-3,
                         lag_mean=2.5, lag_max=4.0, clip_fraction=0.1, train_seconds=0.02,
                         ratio_mean=1.03, valid_fraction=0.75, lag_p90=3.5, learner_fps=9000.0,
                         memory=300.0)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until ``condition()`` holds (messages take a few loop turns, or a socket hop)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.002)


def scalars(folder: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``folder``: tag -> [(step, value)]."""
    events = EventAccumulator(folder)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


async def test_a_resumed_run_counts_on_from_the_frames_its_checkpoint_trained_on(tmp_path):
    folder = str(tmp_path / "tb")
    async with hosted(topology(folder), "inproc") as actors:
        emitter: Emitter = actors["emitter"]
        board: TensorBoardWriter = actors["tensorboard"]
        emitter.training_resumed.emit(TrainingResumed(policy=0, env_frames=1_000_000))
        emitter.rollout_progress.emit(RolloutProgress(worker=0, frames=500))
        emitter.episode_finished.emit(EpisodeFinished(0, episode_return=1.0, length=5, frames=20))
        await until(lambda: 0 in board.episodes)
        await asyncio.sleep(0.2)
        board.write()
    first = scalars(f"{folder}/0")
    # the axis goes on from the checkpoint's frames, as progress.jsonl's env_frames does
    assert first["reward/reward"] == [(1_000_500, 1.0)]
    # but the frame rate counts only the 500 collected since the start (>= 0.2 s ago): at most
    # 2,500/s, where the axis's 1,000,500 frames would make it that only after 400 s
    ((step, fps),) = first["perf/_fps"]
    assert step == 1_000_500 and 0 < fps <= 2_500


@pytest.mark.parametrize("transport", ["inproc", "ipc"])
async def test_scalars_per_policy_against_env_frames(tmp_path, transport):
    folder = str(tmp_path / "tb")
    async with hosted(topology(folder), transport) as actors:
        emitter: Emitter = actors["emitter"]
        board: TensorBoardWriter = actors["tensorboard"]
        emitter.rollout_progress.emit(RolloutProgress(worker=0, frames=600))
        emitter.rollout_progress.emit(RolloutProgress(worker=1, frames=400))
        emitter.training_stats.emit(training_stats(0, loss=0.5, env_frames=768))
        emitter.episode_finished.emit(EpisodeFinished(
            0, episode_return=10.0, length=5, frames=20,
            extra_stats=(("kills", 2.0), ("game/score", 7.0))))
        emitter.episode_finished.emit(EpisodeFinished(0, episode_return=20.0, length=7, frames=28,
                                                      extra_stats=(("kills", 5.0),)))
        # one sender, one receiver: messages arrive in emission order, the episodes last
        await until(lambda: 0 in board.episodes and len(board.episodes[0].returns) == 2)
        assert board.frames == 1000
        board.write()  # the end of a window: episode figures and fps at 1000 frames
        emitter.rollout_progress.emit(RolloutProgress(worker=0, frames=500))
        await until(lambda: board.frames == 1500)
        board.write()  # a window without episodes: only fps, at 1500
        emitter.hyperparams_changed.emit(HyperparamsChanged(
            1, ("appo.lr", "reward_shaping.death"), (2e-4, -0.25)))
        emitter.training_stats.emit(training_stats(1, loss=-0.125, env_frames=512))
        emitter.episode_finished.emit(EpisodeFinished(1, episode_return=-1.0, length=3, frames=12,
                                                      true_return=4.0))
        await until(lambda: 1 in board.episodes)
    # stopping wrote the last window (no frames came in: no fps) and closed the files

    # one TensorBoard run per policy, as Sample Factory's .summary/<policy id>/
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["0", "1"]
    first, second = scalars(f"{folder}/0"), scalars(f"{folder}/1")
    # Sample Factory's episode tags: the window's mean, min and max
    assert first["reward/reward"] == [(1000, 15.0)]
    assert first["reward/reward_min"] == [(1000, 10.0)]
    assert first["reward/reward_max"] == [(1000, 20.0)]
    # lengths in env frames, frameskip counted, as Sample Factory's
    assert first["len/len"] == [(1000, 24.0)]
    assert (first["len/len_min"], first["len/len_max"]) == ([(1000, 20.0)], [(1000, 28.0)])
    # the true objective is the reward where the env reports no score of its own
    assert first["policy_stats/avg_true_objective"] == [(1000, 15.0)]
    # the env's extra stats, averaged over the window's episodes that report each
    assert first["policy_stats/avg_kills"] == [(1000, 3.5)]
    assert first["game/score"] == [(1000, 7.0)]  # a name with "/" is its own tag
    # the learner's figures at the frames it trained on, under Sample Factory's train/ tags
    assert first["train/policy_loss"] == [(768, 0.5)]
    assert first["train/version_diff_avg"] == [(768, 2.5)]
    for tag, value in (("train/value_loss", 0.25), ("train/grad_norm", 1.5),
                       ("train/version_diff_max", 4.0), ("stats/memory_learner", 300.0)):
        assert first[tag] == [(768, value)]
    for tag, value in (("train/lr", 1e-3), ("train/entropy", 0.6), ("train/kl_divergence", 0.01),
                       ("train/ratio_avg", 1.03), ("train/valids_fraction", 0.75),
                       ("train/version_diff_p90", 3.5), ("perf/learner_fps", 9000.0)):
        assert first[tag][0][1] == pytest.approx(value)
    measured = training_stats(0, loss=0.5)
    tags = {figure.tag: name for name, figure in TRAINING_FIGURES.items()}
    assert {tag for tag, name in tags.items()
            if not math.isnan(getattr(measured, name))} <= set(first)
    assert "train/loss" not in first  # NaN: not measured, not written
    # the run's frame rate in policy 0's run only
    assert [step for step, _ in first["perf/_fps"]] == [1000, 1500]
    assert all(fps > 0 for _, fps in first["perf/_fps"])
    assert "perf/_fps" not in second
    assert second["reward/reward"] == [(1500, -1.0)]
    assert second["len/len"] == [(1500, 12.0)]
    # a game score where the env reports one (Atari's raw score, VizDoom's unshaped one)
    assert second["policy_stats/avg_true_objective"] == [(1500, 4.0)]
    assert "policy_stats/avg_kills" not in second
    assert second["train/policy_loss"] == [(512, -0.125)]
    assert second["zz_pbt/cfg_appo.lr"][0][0] == 1500
    assert second["zz_pbt/cfg_appo.lr"][0][1] == pytest.approx(2e-4)
    assert second["zz_pbt/cfg_reward_shaping.death"] == [(1500, -0.25)]


async def test_env_metric_names_are_bounded_per_policy(tmp_path):
    board = TensorBoardWriter("tensorboard", TensorBoardWriter.Params(
        report_every_s=3600.0, tensorboard_dir=str(tmp_path)))
    await board.on_start()
    for n in range(MAX_NAMES_PER_POLICY + 3):
        board.on_episode_finished(EpisodeFinished(0, 1.0, 4, 4, extra_stats=((f"s{n}", 1.0),)))
    board.on_episode_finished(EpisodeFinished(0, 1.0, 4, 4, extra_stats=(("s0", 3.0),)))
    await board.on_stop()
    found = scalars(str(tmp_path / "0"))
    assert found["policy_stats/avg_s0"] == [(0, 2.0)]
    assert f"policy_stats/avg_s{MAX_NAMES_PER_POLICY - 1}" in found
    assert f"policy_stats/avg_s{MAX_NAMES_PER_POLICY}" not in found


async def test_without_a_folder_it_writes_nothing(tmp_path):
    board = TensorBoardWriter("tensorboard", TensorBoardWriter.Params())
    await board.on_start()  # no context, so no run directory
    board.on_rollout_progress(RolloutProgress(worker=0, frames=10))
    board.on_training_stats(training_stats(0, loss=0.5))
    board.write()
    await board.on_stop()
    assert board.writer is None and board.frames == 10
