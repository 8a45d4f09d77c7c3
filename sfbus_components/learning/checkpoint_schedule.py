"""When and where a learner writes its checkpoints: the newest K, the best, milestones.

Under ``<run_dir>/checkpoints/policy_<id>/``:

- ``checkpoint_<version>.pt``: every ``checkpoint_every_s`` and at a graceful stop; the newest
  ``keep_checkpoints`` are kept. A resume starts from the newest readable one.
- ``best/checkpoint_<version>.pt``: the policy whose recent episodes scored highest so far by
  ``save_best_metric`` (the mean over the last ``BEST_EPISODES`` episodes of the policy), written
  once the policy trained on ``save_best_after`` env frames, when the mean beats the best written,
  at most every ``save_best_every_s``; only the best is kept. Its score is stored in the
  checkpoint (``best``) and carried across a resume, so a resumed run keeps a better earlier best.
- ``milestones/checkpoint_<version>.pt``: every ``save_milestones_s`` (0: none), all kept.

The learner hears of episodes through its ``on_episode_finished`` slot (the rollout workers'
``episode_finished`` signal); a topology that does not connect it gets no best checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from sfbus_components.datapath.messages import EpisodeFinished
from sfbus_components.learning.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_newest,
    save_checkpoint,
)

# Episodes in the best-checkpoint metric: the progress line's own average (Stats.average_episodes)
BEST_EPISODES = 100
Kind = Literal["latest", "best", "milestone"]


class LearnerCheckpoints:
    """The checkpoint schedule of one policy's learner (see the module's doc)."""

    def __init__(self, folder: Path, policy: int, params: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = folder
        self.policy = policy
        self.params = params
        """The learner's Params: the ``checkpoint_every_s``, ``save_best_*`` and
        ``save_milestones_s`` fields."""
        self.clock = clock
        self.scores: deque[float] = deque(maxlen=BEST_EPISODES)
        self.best = self._best_written()
        """Score of the best checkpoint written (carried in every checkpoint)."""
        now = clock()
        self._last = {"latest": now, "best": -math.inf, "milestone": now}

    def on_episode(self, msg: EpisodeFinished) -> None:
        """Count an episode of this policy in the best-checkpoint metric."""
        if msg.policy != self.policy:
            return
        score = msg.true_return
        if self.params.save_best_metric == "episode_return" or math.isnan(score):
            score = msg.episode_return  # an env that does not shape reports no true return
        self.scores.append(score)

    def metric(self) -> float:
        """Mean score of the recent episodes (NaN before any)."""
        return sum(self.scores) / len(self.scores) if self.scores else math.nan

    def due(self, env_frames: int) -> tuple[Kind, ...]:
        """The kinds of checkpoint to write now, after a training step."""
        p, now = self.params, self.clock()
        kinds: list[Kind] = []
        if now - self._last["latest"] >= p.checkpoint_every_s:
            kinds.append("latest")
        if (p.save_best_metric and env_frames >= p.save_best_after and self.metric() > self.best
                and now - self._last["best"] >= p.save_best_every_s):
            kinds.append("best")
        if p.save_milestones_s > 0 and now - self._last["milestone"] >= p.save_milestones_s:
            kinds.append("milestone")
        return tuple(kinds)

    def write(self, state: Mapping[str, Any], version: int, kinds: tuple[Kind, ...]) -> list[Path]:
        """Write ``state`` as each of ``kinds``; a kind's clock restarts even if its write
        fails (retried at its next interval)."""
        if "best" in kinds and self.best == -math.inf:
            # No best was readable when this learner started (none yet, or the folder was
            # unreadable then, e.g. replaced for a while): one may be back now, and a worse
            # score must not replace it.
            self.best = self._best_written()
            if not self.metric() > self.best:
                kinds = tuple(k for k in kinds if k != "best")
        score = self.metric() if "best" in kinds else self.best
        state = {**state, "best": {"metric": self.params.save_best_metric, "score": score}}
        written = []
        for kind in kinds:
            self._last[kind] = self.clock()
            if kind == "latest":
                written.append(save_checkpoint(self.folder, state, version,
                                               self.params.keep_checkpoints))
            elif kind == "best":
                written.append(save_checkpoint(self.folder / "best", state, version, keep=1))
                self.best = score
            else:
                written.append(save_checkpoint(self.folder / "milestones", state, version,
                                               keep=0))
        return written

    def write_final(self, state: Mapping[str, Any], version: int) -> Path:
        """Write the checkpoint of a stopping learner; raise ``RuntimeError`` naming the policy
        and the newest checkpoint that does exist where it cannot be written (the run has then
        lost work, and must not end with 0)."""
        try:
            return self.write(state, version, ("latest",))[0]
        except Exception as error:
            raise RuntimeError(f"policy {self.policy}: the final checkpoint could not be "
                               f"written ({type(error).__name__}: {error}); the newest that "
                               f"exists is {self.newest()}") from error

    def newest(self) -> str:
        """The newest periodic checkpoint written so far, or ``none``."""
        return str(latest_checkpoint(self.folder) or "none")

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take the best score of a checkpoint resumed from, where it is above ``best/``'s."""
        self.best = max(self.best, self._score(state))

    def _best_written(self) -> float:
        """The score of the checkpoint in ``best/`` (-inf: none, or unreadable): a best written
        after the newest periodic checkpoint, before a crash, is never replaced by a worse one."""
        with contextlib.suppress(CheckpointError):
            newest = load_newest(self.folder / "best", required=())
            if newest is not None:
                return self._score(newest[1])
        return -math.inf

    def _score(self, state: Mapping[str, Any]) -> float:
        """The best score a checkpoint carries for this run's metric (-inf: none)."""
        best = state.get("best")
        if isinstance(best, dict) and best.get("metric") == self.params.save_best_metric:
            return float(best["score"])
        return -math.inf
