"""What the learner reports of each trained batch: its Prometheus metrics, its warnings and the
:class:`~sfbus_components.datapath.messages.TrainingStats` record it emits.

:class:`~sfbus_components.learning.appo_update.AppoUpdate` returns a batch's figures by their
``TrainingStats`` names, plus its counts (``samples``, ``skipped``, ``trajectory_lags``,
``train_seconds``); :meth:`TrainingReport.stats` turns them into the record and moves the
learner's metrics (``sfbus_learner_<figure>`` gauges among them) with it.
"""

from __future__ import annotations

import logging
from typing import Any

from sfbus import RateLimitedLog
from sfbus_components.datapath.messages import TRAINING_FIGURES, TrainingStats
from sfbus_components.learning.training_state import TrainingState

_LAG_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
_LOW_VALID_FRACTION = 0.5  # below it, most of a batch only feeds V-trace: learning slows


class TrainingReport:
    """The learner ``name``'s report of its trained batches, on ``metrics`` (the actor's own)
    and ``log``."""

    def __init__(self, metrics: Any, log: logging.Logger, name: str, policy: int) -> None:
        self.name = name
        self.policy = policy
        self.skipped_steps = 0
        """Optimizer steps skipped so far (a non-finite loss or gradient)."""
        self._warn = RateLimitedLog(log, 60.0)
        m = metrics
        self.restores = m.counter("good_state_restores",
                                  "last good states put back after bad updates")
        """Counted by the learner's :class:`~sfbus_components.learning.faults.NumericsGuard`."""
        self._samples = m.counter("samples", "samples (agent steps) trained on")
        self._skipped = m.counter("skipped_steps", "steps skipped: non-finite loss or gradient")
        self.checkpoint_failures = m.counter("checkpoint_failures",
                                             "periodic checkpoints that could not be written")
        self._lag = m.histogram("policy_lag", "mean policy lag of each trained trajectory",
                                _LAG_BUCKETS)
        self._gauges = {key: m.gauge(key, f"{figure.doc}, last batch")
                        for key, figure in TRAINING_FIGURES.items()}
        self._version = m.gauge("version", "published weights version")

    def published(self, version: int) -> None:
        """Weights ``version`` are published."""
        self._version.set(version)

    def stats(self, r: dict[str, Any], training: TrainingState, frameskip: int) -> TrainingStats:
        """The record of a batch's update result ``r`` (``AppoUpdate``'s) after ``training``
        moved on (``frameskip``: env frames per sample, for ``learner_fps``); counts its
        samples, skipped steps and lags, warns of skipped steps and of a batch mostly invalid."""
        if r["skipped"]:
            self.skipped_steps += r["skipped"]
            self._skipped.inc(r["skipped"])
            self._warn.warning("skipped", "%s: skipped %d optimizer steps with a non-finite loss "
                               "or gradient (%d so far)", self.name, r["skipped"],
                               self.skipped_steps)
        if r["valid_fraction"] < _LOW_VALID_FRACTION:
            self._warn.warning("invalid", "%s: only %.0f%% of a batch's steps were valid (the rest "
                               "lagged more than appo.max_policy_lag versions, belonged to "
                               "another policy or to an inactive agent): learning slows; lower "
                               "the lag (fewer num_batches_to_accumulate, a faster learner) or "
                               "raise the limit",
                               self.name, 100 * r["valid_fraction"])
        self._samples.inc(r["samples"])
        for lag in r["trajectory_lags"]:
            self._lag.observe(lag)
        stats = TrainingStats(
            policy=self.policy, version=training.version, env_frames=training.env_frames,
            lr=training.lr,
            learner_fps=r["samples"] * frameskip / max(r["train_seconds"], 1e-9),
            samples=r["samples"], **{k: r[k] for k in TRAINING_FIGURES if k in r})
        for key in TRAINING_FIGURES:
            self._gauges[key].set(getattr(stats, key))
        return stats
