"""The runner's statistics: frame rates, episode returns, policy lag and losses; logs and metrics.

Every ``report_every_s`` it logs one line per run and appends a JSON record to
``<run_dir>/progress.jsonl`` (what ``sfbus plot`` and the learning-speed figures read): the env
frames collected (a resumed run's on from the frames its checkpoints trained on, as
``--max-frames`` counts them), the frame rates, and per policy
the moving means of the last ``average_episodes`` episodes (return, length, true return and each
number the envs report in ``episode_extra_stats``) and every training figure of the learner's
last step.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sfbus import Actor, ArraySpec, Interval, RateLimitedLog, RunRecords, Topology, slot
from sfbus_components.datapath.buffers import totals_name, totals_spec
from sfbus_components.datapath.messages import (
    TRAINING_FIGURES,
    EpisodeFinished,
    RolloutProgress,
    TrainingResumed,
    TrainingStats,
)
from sfbus_components.monitoring.status import progress_bar, status_line
from sfbus_components.sampling.extra_stats import MAX_NAMES_PER_POLICY

# Windows for the frame rate, in seconds (the paper and Sample Factory report 10 s and 60 s).
_FPS_WINDOWS = (10.0, 60.0)
# The longest wait at a stop for the rollout workers' last reports: they send them at once on
# Stop, which reaches every process together. At most a quarter of the run's stop timeout: the
# rest is left to the actors that stop after this one in its process (the learner's final
# checkpoint).
_FINAL_REPORTS_WAIT_S = 2.0


@dataclass
class _PolicyStats:
    returns: deque[float]
    lengths: deque[int]
    true_returns: deque[float]
    """The game scores of episodes whose env reports one apart from the reward trained on
    (VizDoom's unshaped score, Atari's raw score)."""
    extra: dict[str, deque[float]] = field(default_factory=dict)
    """The envs' ``episode_extra_stats`` by name, over the same episodes as the returns."""
    episodes: int = 0
    last: TrainingStats | None = None
    frames: int = 0
    """Env frames its agents collected (reported with a population only)."""
    fps: float | None = None
    """Its frames per second over the shorter window, and its share of all of them."""
    share: float = 0.0


class Stats(Actor):
    """Collects the data path's statistics signals and reports them."""

    component = "runner"

    @dataclass(frozen=True)
    class Params:
        report_every_s: Interval = 5.0
        """Seconds between reports."""
        average_episodes: int = 100
        """Episodes in the moving average of returns (100, as CartPole's 'solved' bar uses)."""
        live: Literal["auto", "on", "off"] = "auto"
        """Redraw one status line in place each second (``auto``: when stderr is a terminal);
        otherwise log a plain line each report."""
        show_stats: tuple[str, ...] = ()
        """Names of the envs' ``episode_extra_stats`` shown in the status line too (every one
        is in ``progress.jsonl``, TensorBoard and the metrics)."""

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """The run's totals, [frames, start time in monotonic ns], kept across a restart."""
        return [totals_spec(name)]

    async def on_start(self) -> None:
        """Start the report timer (a restarted actor continues the run's frames and clock)."""
        self._warn = RateLimitedLog(self.log)
        totals = totals_name(self.name)
        self._totals = (self.context.shared(totals).numpy
                        if self.context is not None and totals in self.context.array_specs
                        else None)
        now_ns = time.monotonic_ns()  # the monotonic clock is system-wide: a new process agrees
        if self._totals is not None and self._totals[1] == 0:
            self._totals[1] = now_ns
        start_ns = now_ns if self._totals is None else int(self._totals[1])
        self.started = time.monotonic() - (now_ns - start_ns) / 1e9
        self.frames = 0 if self._totals is None else int(self._totals[0])
        self.history: deque[tuple[float, int]] = deque([(time.monotonic(), self.frames)])
        self.policies: dict[int, _PolicyStats] = {}
        # (time, frames per policy) at each report, for each policy's frame rate and share
        self.policy_history: deque[tuple[float, dict[int, int]]] = deque()
        family = self.metrics
        self._frames_metric = family.counter_family("sfbus_runner_env_frames_total",
                                                    "Environment frames collected")
        self._fps_metric = family.gauge_family("sfbus_runner_fps", "Env frames per second",
                                               ("window",))
        self._reward_metric = family.gauge_family("sfbus_runner_episode_reward",
                                                  "Mean episode return (moving average)",
                                                  ("policy",))
        self._true_reward_metric = family.gauge_family(
            "sfbus_runner_episode_true_reward", "Mean episode true objective, the env's unshaped "
            "score where it reports one (moving average)", ("policy",))
        self._length_metric = family.gauge_family("sfbus_runner_episode_length",
                                                  "Mean episode length in env steps", ("policy",))
        self._extra_metric = family.gauge_family(
            "sfbus_runner_episode_stat", "Mean of a number the env reports at an episode's end "
            "(episode_extra_stats; moving average)", ("policy", "name"))
        self._episodes_metric = family.counter_family("sfbus_runner_episodes_total",
                                                      "Finished episodes", ("policy",))
        self._policy_fps_metric = family.gauge_family(
            "sfbus_runner_policy_fps", "Env frames per second collected by a policy's agents "
            "(10 s)", ("policy",))
        self._awaited_workers = self._workers_reporting_at_stop()
        self._final_reports = asyncio.Event()
        if not self._awaited_workers:
            self._final_reports.set()
        self.live = self.params.live == "on" or (self.params.live == "auto"
                                                 and sys.stderr.isatty())
        self.every(self.params.report_every_s, self.report)
        if self.live:
            self.every(1.0, self.draw)

    async def on_stop(self) -> None:
        """Write the run's last record (a run shorter than ``report_every_s`` has one too), once
        the rollout workers of other processes sent their last reports, and end the live line
        so the shell prompt starts on a fresh one.

        On one loop (serial mode) the workers whose processes stop before this actor's (all
        whose signals reach it and that it does not reach back) are waited for too; a worker
        that stops after it, or in its own process, misses the record with its last frames."""
        if not self._final_reports.is_set():
            assert self.context is not None  # only the workers of a run are awaited
            wait = min(_FINAL_REPORTS_WAIT_S, self.context.table.topology.run.stop_timeout_s / 4)
            try:
                await asyncio.wait_for(self._final_reports.wait(), wait)
            except TimeoutError:  # a worker dead at the stop (restarting) sends none
                self.log.warning("%s: no last progress report from rollout workers %s within "
                                 "%g s: the last record misses the frames they stepped since "
                                 "their previous one", self.name, sorted(self._awaited_workers),
                                 wait)
        self.report()
        if self.live:
            self.draw()
            sys.stderr.write("\n")
            sys.stderr.flush()

    def draw(self) -> None:
        """Redraw the live status line in place."""
        now = time.monotonic()
        self.history.append((now, self.frames))
        rates = {f"{w:g}s": self.fps(w) for w in _FPS_WINDOWS}
        limits = self.context.limits if self.context is not None else None
        bar = progress_bar(limits, self.frames, now - self.started,
                           rates["60s"]) if limits is not None else ""
        policies = {str(p): self._policy_record(p, s) for p, s in sorted(self.policies.items())}
        sys.stderr.write("\r\x1b[2K" + status_line(self.frames, rates, policies, bar,
                                                     self.params.show_stats))
        sys.stderr.flush()

    def _policy(self, policy: int) -> _PolicyStats:
        stats = self.policies.get(policy)
        if stats is None:
            n = self.params.average_episodes
            stats = self.policies[policy] = _PolicyStats(deque(maxlen=n), deque(maxlen=n),
                                                         deque(maxlen=n))
        return stats

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Record one finished episode."""
        stats = self._policy(msg.policy)
        stats.returns.append(msg.episode_return)
        stats.lengths.append(msg.length)
        if not math.isnan(msg.true_return):
            stats.true_returns.append(msg.true_return)
        stats.episodes += 1
        self._episodes_metric.labels(str(msg.policy)).inc()
        for name, value in msg.extra_stats:
            values = stats.extra.get(name)
            if values is None:
                if len(stats.extra) == MAX_NAMES_PER_POLICY:  # bounds the metrics' series
                    self._warn.warning("extra", "%s: policy %d's envs reported more than %d "
                                       "names of episode_extra_stats: %r and later ones are "
                                       "dropped", self.name, msg.policy, MAX_NAMES_PER_POLICY,
                                       name)
                    continue
                values = stats.extra[name] = deque(maxlen=self.params.average_episodes)
            values.append(value)

    def _workers_reporting_at_stop(self) -> set[int]:
        """The rollout workers that report to this actor and send their last report while it
        still runs: those of other processes, which stop together with it, and those of the
        processes on its own loop that stop before its own; the run's last record waits for
        their last reports."""
        if self.context is None:
            return set()
        table, hosted = self.context.table, self.context.hosted
        order = table.stop_order(hosted)
        before = set(order[: order.index(self.context.process)])
        senders = (table.actors[edge.source] for edge in table.edges
                   if edge.target == self.name and edge.slot == "on_rollout_progress")
        return {sender.replica for sender in senders
                if sender.process not in hosted or sender.process in before}

    @slot
    async def on_rollout_progress(self, msg: RolloutProgress) -> None:
        """Count frames collected by a rollout worker (``async``: the mailbox delivers the
        workers' last reports while ``on_stop`` waits for them)."""
        if msg.final:
            self._awaited_workers.discard(msg.worker)
            if not self._awaited_workers:
                self._final_reports.set()
        self.frames += msg.frames
        self._frames_metric.inc(msg.frames)
        if self._totals is not None:
            self._totals[0] = self.frames
        for policy, frames in enumerate(msg.policy_frames):
            if frames:
                self._policy(policy).frames += frames

    @slot
    def on_training_resumed(self, msg: TrainingResumed) -> None:
        """Count on from the frames a resumed learner's checkpoint trained on, as the run's
        ``--max-frames`` does (not frames collected now: the frame rates leave them out)."""
        self.frames += msg.env_frames
        self.history = deque((t, frames + msg.env_frames) for t, frames in self.history)
        if self._totals is not None:
            self._totals[0] = self.frames

    @slot
    def on_training_stats(self, msg: TrainingStats) -> None:
        """Keep the learner's latest figures."""
        self._policy(msg.policy).last = msg

    def fps(self, window: float) -> float:
        """Env frames per second over the last ``window`` seconds (or since start)."""
        now_t, now_frames = self.history[-1]
        then_t, then_frames = self.history[0]
        for then_t, then_frames in self.history:  # noqa: B007 - the first inside the window
            if now_t - then_t <= window:
                break
        return (now_frames - then_frames) / max(now_t - then_t, 1e-9)

    def report(self) -> None:
        """Log one status line and append a progress record."""
        now = time.monotonic()
        self.history.append((now, self.frames))
        while now - self.history[0][0] > max(_FPS_WINDOWS) + self.params.report_every_s:
            self.history.popleft()
        rates = {f"{w:g}s": self.fps(w) for w in _FPS_WINDOWS}
        for window, rate in rates.items():
            self._fps_metric.labels(window).set(rate)
        self._policy_rates(now)
        record = {"time": round(now - self.started, 3), "env_frames": self.frames,
                  "fps": {k: round(v, 1) for k, v in rates.items()}, "policies": {}}
        parts = [f"frames {self.frames:,}", "fps " + " / ".join(
            f"{v:,.0f} ({k})" for k, v in rates.items())]
        for policy, stats in sorted(self.policies.items()):
            entry = self._policy_record(policy, stats)
            record["policies"][str(policy)] = entry
            if "reward" in entry:
                true = f" true {entry['true_reward']:.2f}" if "true_reward" in entry else ""
                parts.append(f"p{policy} reward {entry['reward']:.2f}{true} "
                             f"len {entry['length']:.0f}")
            parts += [f"{name} {entry['extra_stats'][name]:.2f}" for name in self.params.show_stats
                      if name in entry.get("extra_stats", {})]
            if stats.fps is not None:
                name = "" if "reward" in entry else f"p{policy} "
                parts.append(f"{name}fps {stats.fps:,.0f} ({stats.share:.0%})")
            if stats.last is not None:
                parts.append(f"v{stats.last.version} lag {stats.last.lag_mean:.1f} "
                             f"loss {stats.last.policy_loss:+.3f}/{stats.last.value_loss:.3f}")
        if not self.live:
            self.log.info(" | ".join(parts))
        if self.context is not None and self.context.run_dir is not None:
            try:
                with Path(self.context.run_dir, "progress.jsonl").open("a") as out:
                    out.write(json.dumps(record) + "\n")
            except OSError as error:  # a full disk: training and the status line go on
                self._warn.warning("progress", "%s: cannot append to progress.jsonl (%s): this "
                                   "report's record is lost", self.name, error)

    def _policy_rates(self, now: float) -> None:
        """Each policy's frame rate over the shorter window and its share of the total."""
        totals = {p: s.frames for p, s in self.policies.items() if s.frames}
        if not totals:
            return
        self.policy_history.append((now, totals))
        window = min(_FPS_WINDOWS)
        while len(self.policy_history) > 1 and now - self.policy_history[1][0] >= window:
            self.policy_history.popleft()
        then, before = self.policy_history[0]
        rates = {p: (n - before.get(p, 0)) / max(now - then, 1e-9) for p, n in totals.items()}
        total = sum(rates.values())
        for policy, rate in rates.items():
            stats = self.policies[policy]
            stats.fps, stats.share = rate, rate / total if total > 0 else 0.0
            self._policy_fps_metric.labels(str(policy)).set(rate)

    def _policy_record(self, policy: int, stats: _PolicyStats) -> dict[str, Any]:
        entry: dict[str, Any] = {"episodes": stats.episodes}
        if stats.returns:
            entry["reward"] = sum(stats.returns) / len(stats.returns)
            entry["length"] = sum(stats.lengths) / len(stats.lengths)
            self._reward_metric.labels(str(policy)).set(entry["reward"])
            self._length_metric.labels(str(policy)).set(entry["length"])
        if stats.true_returns:
            entry["true_reward"] = sum(stats.true_returns) / len(stats.true_returns)
            self._true_reward_metric.labels(str(policy)).set(entry["true_reward"])
        if stats.extra:
            entry["extra_stats"] = {name: sum(v) / len(v) for name, v in stats.extra.items()}
            for name, mean in entry["extra_stats"].items():
                self._extra_metric.labels(str(policy), name).set(mean)
        if stats.fps is not None:
            entry.update(fps=round(stats.fps, 1), fps_share=round(stats.share, 4))
        if stats.last is not None:
            last = stats.last
            # trained_frames: the env frames the learner has trained on (Sample Factory's count);
            # the record's env_frames counts them when sampled, up to a few batches earlier.
            # every training figure measured at the last step (``lag``: the mean, as plotted)
            entry.update(version=last.version, trained_frames=last.env_frames,
                         lag=last.lag_mean, samples=last.samples,
                         **{name: value for name in TRAINING_FIGURES
                            if not math.isnan(value := getattr(last, name))})
        return entry
