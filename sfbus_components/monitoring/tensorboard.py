"""TensorBoard event files of a run, in Sample Factory's layout and tags, against env frames.

One TensorBoard run per policy, ``<run_dir>/tensorboard/<policy id>/`` (Sample Factory's
``<experiment>/.summary/<policy id>/``), under Sample Factory 2.x's tags, so that its users' saved
views and comparisons work: ``reward/reward`` (``_min``, ``_max``), ``len/len`` (``_min``,
``_max``; in env frames), ``policy_stats/avg_true_objective`` (``_min``, ``_max``: the env's
unshaped score where it reports one, else the reward), ``policy_stats/avg_<name>`` for each
number an env reports in ``episode_extra_stats`` (a name holding ``/`` is its own tag),
``train/...`` and ``stats/memory_learner`` for the learner's figures (the tag of each is declared
beside it, :data:`sfbus_components.datapath.messages.TRAINING_FIGURES`), ``perf/_fps`` (env
frames per second of the whole run, in policy 0's run) and ``zz_pbt/cfg_<name>`` for PBT's
hyperparameters. The mapping from sfbus's names is in docs/FROM_SAMPLE_FACTORY.md.

Listens to the same signals as the statistics actor (``sfbus_components.monitoring.stats``);
every scalar's step is a count of env frames. Episode figures and the frame rate are written
once per ``report_every_s`` window, over the window's episodes (a fast env finishes hundreds of
episodes per second), at the frames collected so far: the sum of the rollout workers' progress
reports (a resumed run's on from the frames its checkpoints trained on), the ``env_frames`` of
``progress.jsonl``, so they line up with ``sfbus plot``. The
learner's figures are written once per training step at the frames that learner has trained on
(its ``TrainingStats.env_frames``, Sample Factory's step for them too): exact per step and
continued across a resume. A figure that is NaN (not measured) is not written.

With ``wandb.project`` set, the same scalars also go to Weights & Biases with the run's settings
as its config (:mod:`sfbus_components.monitoring.wandb_sink`), as ``<policy id>/<tag>``.
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
    HyperparamsChanged,
    RolloutProgress,
    TrainingResumed,
    TrainingStats,
)
from sfbus_components.monitoring.wandb_sink import WandbConfig, WandbSink
from sfbus_components.sampling.extra_stats import MAX_NAMES_PER_POLICY

_FPS_POLICY = 0
"""The policy whose TensorBoard run holds the run-wide frame rate (Sample Factory's default)."""


@dataclass
class _Episodes:
    """Episodes of one policy finished since the last write."""

    returns: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    """In env frames (frameskip counted), as Sample Factory's ``len``."""
    true_objectives: list[float] = field(default_factory=list)
    """The env's unshaped score where it reports one, else the return (Sample Factory's)."""
    extra: dict[str, list[float]] = field(default_factory=dict)
    """The envs' ``episode_extra_stats``, by name."""
    names: set[str] = field(default_factory=set)
    """Every name kept so far, at most ``MAX_NAMES_PER_POLICY`` (the statistics actor warns
    about the others)."""

    def add(self, msg: EpisodeFinished) -> None:
        """Keep one episode's figures."""
        self.returns.append(msg.episode_return)
        self.lengths.append(msg.frames)
        self.true_objectives.append(msg.episode_return if math.isnan(msg.true_return)
                                    else msg.true_return)
        for name, value in msg.extra_stats:
            if name in self.names or len(self.names) < MAX_NAMES_PER_POLICY:
                self.names.add(name)
                self.extra.setdefault(name, []).append(value)

    def scalars(self) -> list[tuple[str, float]]:
        """Sample Factory's episode tags of the window, then clear it: (tag, value)."""
        found: list[tuple[str, float]] = []
        for tag, values in (("reward/reward", self.returns), ("len/len", self.lengths),
                            ("policy_stats/avg_true_objective", self.true_objectives)):
            if values:
                found += [(tag, sum(values) / len(values)), (f"{tag}_min", min(values)),
                          (f"{tag}_max", max(values))]
            values.clear()
        for name, values in self.extra.items():
            found.append((name if "/" in name else f"policy_stats/avg_{name}",
                          sum(values) / len(values)))
        self.extra.clear()
        return found


class TensorBoardWriter(Actor):
    """Writes the run's statistics as TensorBoard scalars, one TensorBoard run per policy."""

    component = "tensorboard"

    @dataclass(frozen=True)
    class Params:
        report_every_s: Interval = 5.0
        """Seconds between writes of episode figures and the frame rate (and file flushes)."""
        tensorboard_dir: str = ""
        """Where the policies' folders go; empty: ``<run_dir>/tensorboard``."""
        wandb: WandbConfig = field(default_factory=WandbConfig)
        """Weights & Biases logging of the same scalars (``--set wandb.project=NAME``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames = 0
        self.episodes: dict[int, _Episodes] = {}
        self.writer: _Sinks | None = None
        """Where scalars go; None until started, without a folder, and after stopping."""
        self._last = (time.monotonic(), 0)

    async def on_start(self) -> None:
        """Start the write timer (nothing is written without a dir); event files open with
        each policy's first scalar."""
        self._last = (time.monotonic(), self.frames)
        folder = self.params.tensorboard_dir
        if not folder and self.context is not None and self.context.run_dir is not None:
            folder = str(Path(self.context.run_dir, "tensorboard"))
        if not folder:
            self.log.info("%s: no run directory and no tensorboard_dir; writing nothing",
                          self.name)
            return
        # flush_secs only bounds the writer thread's own flushes; write() flushes every window.
        self.writer = _Sinks(folder, max(1, round(self.params.report_every_s)),
                             RateLimitedLog(self.log), self.name,
                             self._open_wandb() if self.params.wandb.project else None)
        self.every(self.params.report_every_s, self.write, "tensorboard write")

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Keep one finished episode for the next window's figures."""
        episodes = self.episodes.get(msg.policy)
        if episodes is None:
            episodes = self.episodes[msg.policy] = _Episodes()
        episodes.add(msg)

    @slot
    def on_rollout_progress(self, msg: RolloutProgress) -> None:
        """Count env frames: the step of every scalar."""
        self.frames += msg.frames

    @slot
    def on_training_resumed(self, msg: TrainingResumed) -> None:
        """Count on from the frames a resumed learner's checkpoint trained on, as
        ``progress.jsonl`` does (the frame rate leaves them out)."""
        then, frames = self._last
        self.frames += msg.env_frames
        self._last = (then, frames + msg.env_frames)

    @slot
    def on_training_stats(self, msg: TrainingStats) -> None:
        """Write the learner's figures of one training step."""
        if self.writer is None:
            return
        for name, figure in TRAINING_FIGURES.items():
            value = getattr(msg, name)
            if not math.isnan(value):
                self.writer.add_scalar(msg.policy, figure.tag, value, msg.env_frames)

    @slot
    def on_hyperparams_changed(self, msg: HyperparamsChanged) -> None:
        """Write a policy's PBT-managed hyperparameters (``zz_pbt/cfg_<name>``)."""
        if self.writer is None:
            return
        for name, value in zip(msg.names, msg.values, strict=True):
            self.writer.add_scalar(msg.policy, f"zz_pbt/cfg_{name}", value, self.frames)

    def write(self, final: bool = False) -> None:
        """Write each policy's episode figures of the window and the run's frame rate; flush.

        The last window (``final``) gets a frame rate only if frames came in: the rollout
        workers may have stopped first, and a made-up drop to 0 would end every curve.
        """
        if self.writer is None:
            return
        for policy, episodes in sorted(self.episodes.items()):
            for tag, value in episodes.scalars():
                self.writer.add_scalar(policy, tag, value, self.frames)
        now = time.monotonic()
        then, frames = self._last
        if now > then and (self.frames > frames or not final):
            self.writer.add_scalar(_FPS_POLICY, "perf/_fps",
                                   (self.frames - frames) / (now - then), self.frames)
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
        """Write the last window and close the event files."""
        if self.writer is not None:
            self.write(final=True)
            self.writer.close()
            self.writer = None


class _Sinks:
    """Every policy's event files (``<folder>/<policy id>``, opened at its first scalar) and,
    when set, W&B (``<policy id>/<tag>``)."""

    def __init__(self, folder: str, flush_secs: int, warn: RateLimitedLog, name: str,
                 wandb: WandbSink | None) -> None:
        self.folder, self.flush_secs, self.warn, self.name = folder, flush_secs, warn, name
        self.wandb = wandb
        self.policies: dict[int, _EventFiles] = {}

    def add_scalar(self, policy: int, tag: str, value: float, step: int) -> None:
        """Write one scalar of ``policy``."""
        files = self.policies.get(policy)
        if files is None:
            files = self.policies[policy] = _EventFiles(
                str(Path(self.folder, str(policy))), self.flush_secs, self.warn, self.name)
        files.add_scalar(tag, value, step)
        if self.wandb is not None:
            self.wandb.add_scalar(f"{policy}/{tag}", value, step)

    def flush(self) -> None:
        """Flush every sink."""
        for files in self.policies.values():
            files.flush()
        if self.wandb is not None:
            self.wandb.flush()

    def close(self) -> None:
        """Close every sink."""
        for files in self.policies.values():
            files.close()
        if self.wandb is not None:
            self.wandb.close()


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
