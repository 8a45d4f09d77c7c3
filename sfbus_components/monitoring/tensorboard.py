"""TensorBoard event files of a run: returns, losses, policy lag and frame rate against env frames.

Listens to the same signals as the statistics actor (``sfbus_components.monitoring.stats``); every
scalar's step is a count of env frames. Episode means and the frame rate are written once per
``report_every_s`` window (a fast env finishes hundreds of episodes per second) at the frames
collected so far: the sum of the rollout workers' progress reports, the ``env_frames`` of
``progress.jsonl``, so they line up with ``sfbus plot``. The learner's figures are written once
per training step at the frames that learner has trained on (its ``TrainingStats.env_frames``):
progress reports come once a second, several training steps apart, and the learner's count is
exact per step and continues across a resume. The two counts differ by the frames in flight, a
batch or two. Files go to ``<run_dir>/tensorboard/`` (``tensorboard --logdir RUN_DIR``).

With ``wandb.project`` set, the same scalars also go to Weights & Biases with the run's settings
as its config (:mod:`sfbus_components.monitoring.wandb_sink`).

Tags: ``policy_<id>/reward``, ``true_reward`` (the game score, where the env reports one),
``episode_length``, every learner figure of
:data:`sfbus_components.datapath.messages.TRAINING_FIGURES` under its name (losses, KL, ratio,
advantage and value statistics, valid fraction, lag quantiles, gradient norm, learning rate,
the learner's frame rate; ``lag`` for ``lag_mean``); and ``run/fps`` (env frames per second of
the whole run, all policies).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sfbus import Actor, Interval, RateLimitedLog, slot
from sfbus_components.datapath.messages import (
    TRAINING_FIGURES,
    EpisodeFinished,
    RolloutProgress,
    TrainingStats,
)
from sfbus_components.monitoring.wandb_sink import WandbConfig, WandbSink
from sfbus_components.pbt.messages import HyperparamsChanged

# TrainingStats fields written per training step, by tag name (the mean lag keeps its old tag).
_TRAINING_TAGS = {"lag" if name == "lag_mean" else name: name for name in TRAINING_FIGURES}


@dataclass
class _Episodes:
    """Episodes of one policy finished since the last write."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    true_returns: list[float] = field(default_factory=list)
    """Game scores, for envs that report one apart from the reward trained on."""


class TensorBoardWriter(Actor):
    """Writes the run's statistics as TensorBoard scalars."""

    component = "tensorboard"

    @dataclass(frozen=True)
    class Params:
        report_every_s: Interval = 5.0
        """Seconds between writes of episode means and the frame rate (and file flushes)."""
        tensorboard_dir: str = ""
        """Where the event files go; empty: ``<run_dir>/tensorboard``."""
        wandb: WandbConfig = field(default_factory=WandbConfig)
        """Weights & Biases logging of the same scalars (``--set wandb.project=NAME``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames = 0
        self.episodes: dict[int, _Episodes] = {}
        self.writer: Any = None
        """Where scalars go: the SummaryWriter, or a fan-out to it and W&B; None until started,
        without a folder, and after stopping."""
        self._last = (time.monotonic(), 0)

    async def on_start(self) -> None:
        """Open the event file and start the write timer (nothing is written without a dir)."""
        self._last = (time.monotonic(), self.frames)
        folder = self.params.tensorboard_dir
        if not folder and self.context is not None and self.context.run_dir is not None:
            folder = str(Path(self.context.run_dir, "tensorboard"))
        if not folder:
            self.log.info("%s: no run directory and no tensorboard_dir; writing nothing",
                          self.name)
            return
        # flush_secs only bounds the writer thread's own flushes; write() flushes every window.
        self.writer = _EventFiles(folder, max(1, round(self.params.report_every_s)),
                                  RateLimitedLog(self.log), self.name)
        if self.params.wandb.project:
            self.writer = _Both(self.writer, self._open_wandb())
        self.every(self.params.report_every_s, self.write, "tensorboard write")

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Keep one finished episode for the next window's mean."""
        episodes = self.episodes.get(msg.policy)
        if episodes is None:
            episodes = self.episodes[msg.policy] = _Episodes()
        episodes.returns.append(msg.episode_return)
        episodes.lengths.append(msg.length)
        if not math.isnan(msg.true_return):
            episodes.true_returns.append(msg.true_return)

    @slot
    def on_rollout_progress(self, msg: RolloutProgress) -> None:
        """Count env frames: the step of every scalar."""
        self.frames += msg.frames

    @slot
    def on_training_stats(self, msg: TrainingStats) -> None:
        """Write the learner's figures of one training step."""
        if self.writer is None:
            return
        prefix = f"policy_{msg.policy}"
        for tag, name in _TRAINING_TAGS.items():
            self.writer.add_scalar(f"{prefix}/{tag}", getattr(msg, name), msg.env_frames)

    @slot
    def on_hyperparams_changed(self, msg: HyperparamsChanged) -> None:
        """Write a policy's PBT-managed hyperparameters (``policy_<id>/hp/<name>``)."""
        if self.writer is None:
            return
        for name, value in zip(msg.names, msg.values, strict=True):
            self.writer.add_scalar(f"policy_{msg.policy}/hp/{name}", value, self.frames)

    def write(self, final: bool = False) -> None:
        """Write each policy's episode means of the window and the run's frame rate; flush.

        The last window (``final``) gets a frame rate only if frames came in: the rollout
        workers may have stopped first, and a made-up drop to 0 would end every curve.
        """
        if self.writer is None:
            return
        for policy, episodes in sorted(self.episodes.items()):
            if episodes.returns:
                count = len(episodes.returns)
                prefix = f"policy_{policy}"
                self.writer.add_scalar(f"{prefix}/reward", sum(episodes.returns) / count,
                                       self.frames)
                self.writer.add_scalar(f"{prefix}/episode_length", sum(episodes.lengths) / count,
                                       self.frames)
                if episodes.true_returns:
                    self.writer.add_scalar(
                        f"{prefix}/true_reward",
                        sum(episodes.true_returns) / len(episodes.true_returns), self.frames)
                episodes.returns.clear()
                episodes.lengths.clear()
                episodes.true_returns.clear()
        now = time.monotonic()
        then, frames = self._last
        if now > then and (self.frames > frames or not final):
            self.writer.add_scalar("run/fps", (self.frames - frames) / (now - then), self.frames)
        self._last = (now, self.frames)
        self.writer.flush()

    def _open_wandb(self) -> WandbSink:
        run_dir = Path(self.context.run_dir if self.context and self.context.run_dir else ".")
        snapshot = run_dir / "topology.yaml"
        settings = {}
        if snapshot.is_file():  # the run's settings as it was started, --set included
            import yaml

            settings = (yaml.safe_load(snapshot.read_text()) or {}).get("settings") or {}
        return WandbSink(self.params.wandb, run_dir, settings)

    async def on_stop(self) -> None:
        """Write the last window and close the event file."""
        if self.writer is not None:
            self.write(final=True)
            self.writer.close()
            self.writer = None


class _EventFiles:
    """TensorBoard's ``SummaryWriter`` that outlives a full disk: a write or flush that fails
    with ``OSError`` closes it (its writer thread has died) and warns that scalars are being
    lost; the next flush opens a new event file in the same folder (TensorBoard reads them all
    as one run). Training goes on meanwhile: a full disk is no failure of this actor."""

    def __init__(self, folder: str, flush_secs: int, warn: RateLimitedLog, name: str) -> None:
        self.folder, self.flush_secs, self.warn, self.name = folder, flush_secs, warn, name
        self.writer: Any = None
        self._open()

    def _open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter  # loads tensorboard: only when used

        try:
            self.writer = SummaryWriter(self.folder, flush_secs=self.flush_secs)
        except OSError as error:
            self._lose(error)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """Write one scalar (lost while the folder cannot be written)."""
        if self.writer is not None:
            try:
                self.writer.add_scalar(tag, value, step)
            except OSError as error:
                self._lose(error)

    def flush(self) -> None:
        """Flush the event file, or open a new one after a failure."""
        if self.writer is None:
            self._open()
            return
        try:
            self.writer.flush()
        except OSError as error:
            self._lose(error)

    def close(self) -> None:
        """Close the event file (a writer that failed may raise its error again: dropped)."""
        writer, self.writer = self.writer, None
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()

    def _lose(self, error: OSError) -> None:
        self.warn.warning("lost", "%s: cannot write event files in %s (%s): scalars are lost "
                          "until it can, then a new event file follows", self.name, self.folder,
                          error)
        self.close()


class _Both:
    """Scalars into the TensorBoard writer and into W&B."""

    def __init__(self, tensorboard: Any, wandb: WandbSink) -> None:
        self.sinks = (tensorboard, wandb)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """Write one scalar to both."""
        for sink in self.sinks:
            sink.add_scalar(tag, value, step)

    def flush(self) -> None:
        """Flush both."""
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        """Close both."""
        for sink in self.sinks:
            sink.close()
