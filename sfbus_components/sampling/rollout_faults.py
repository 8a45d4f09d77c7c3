"""The rollout worker's side of surviving faults: an object the worker owns, ``RolloutFaults``.

- **Its own restart.** At start it reclaims the slots its previous incarnation left taken that
  nobody downstream holds (:class:`sfbus_components.datapath.slot_stages.WorkerSlots`); the worker
  then takes fresh slots split by split as the pool allows (the batcher may still hold many).
- **A batcher's restart.** ``BatcherStarted`` (and a periodic look at the epochs in shared
  memory, for an announcement it missed) releases the slots the old batcher held.
- **An inference worker's restart.** Every request carries a sequence number. A split whose
  actions did not come within ``inference_timeout_s`` (checked every that many seconds, so after
  one to two timeouts) sends its request again under a new number; an answer to an older number
  is ignored. So a request lost with a dead inference worker costs a few seconds, never a hang.
- **Env faults** are the envs' owner's: :mod:`sfbus_components.sampling.worker_envs`.
- **Audit.** At a graceful stop it logs its slots by stage and whatever does not add up.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from sfbus import ActorContext, SlotPool
from sfbus_components.datapath.slot_stages import WorkerSlots


class RolloutFaults:
    """Slot stages and request numbers of rollout worker ``name`` with ``splits`` splits."""

    def __init__(self, context: ActorContext, name: str, pool: SlotPool, splits: int,
                 log: logging.Logger) -> None:
        self.name = name
        self.log = log
        self.stages = WorkerSlots(context, name, pool)
        """Who holds each of the worker's slots (shared memory, survives restarts)."""
        self.restart_salt = pool.acquired_total
        """0 at a run's first start: a restarted worker seeds its envs afresh with it."""
        reclaimed = self.stages.reclaim()
        if reclaimed or pool.in_use:
            log.warning("%s: restarted; took back %d slots and leaves %d with the batcher and "
                        "learner", name, reclaimed, pool.in_use)
        # Request numbers start from the (system-wide monotonic) clock, so that a restarted
        # worker never takes an answer meant for its previous incarnation.
        self.seq = [time.monotonic_ns()] * splits
        """The number of each split's newest request."""
        self._seq_checked = list(self.seq)
        self.requests_resent = 0
        self.stale_answers = 0

    def next_seq(self, s: int) -> int:
        """The number of split ``s``'s next inference request."""
        self.seq[s] += 1
        return self.seq[s]

    def stale(self, s: int, seq: int) -> bool:
        """Whether an answer numbered ``seq`` is for a request of ``s`` sent again since."""
        if seq and seq != self.seq[s]:
            self.stale_answers += 1
            return True
        return False

    def overdue(self, awaiting: list[int]) -> list[int]:
        """The splits still awaiting (``awaiting[s]`` requests) the request they had sent by the
        previous call: theirs go again (call every ``inference_timeout_s``)."""
        late = [s for s, seq in enumerate(self.seq) if awaiting[s] and seq == self._seq_checked[s]]
        self.requests_resent += len(late)
        self._seq_checked = list(self.seq)
        return late

    def batcher_started(self, policy: int, epoch: int) -> int:
        """A batcher of ``policy`` (re)started as ``epoch``: release what older ones held;
        returns how many slots came back."""
        return self._took_back(self.stages.advance(policy, epoch))

    def poll_batchers(self) -> int:
        """Catch up with batcher restarts whose announcement was missed; slots that came back."""
        return self._took_back(self.stages.poll())

    def audit(self, active: list[np.ndarray]) -> None:
        """Log the slot audit; ``active`` are the slots the unpaused splits fill."""
        counts = self.stages.audit(np.concatenate(active) if active else np.zeros(0, int))
        self.log.info("%s: slot audit: %s", self.name,
                      " ".join(f"{k}={v}" for k, v in counts.items()))

    def _took_back(self, released: int) -> int:
        if released:
            self.log.warning("%s: a batcher restarted; took back the %d slots the old one held",
                             self.name, released)
        return released
