"""A learner's recovery: continuing after a restart, and surviving non-finite updates.

**Restart.** A restarted learner continues from the newer of its latest checkpoint and the
weights it last published in shared memory (``policy.<id>.weights`` and its version survive the
process); the optimizer state and counters come from the checkpoint (or start afresh without
one). A version number never goes back.

**Numerics.** Non-finite updates are skipped (see ``AppoUpdate._sgd_step``); after
``max_bad_updates`` in a row, :class:`NumericsGuard` puts back the last good state it keeps in
memory (copied every ``good_state_every`` batches while healthy).
"""

from __future__ import annotations

import logging
from typing import Any

from sfbus_components.datapath.buffers import PolicyWeights
from sfbus_components.learning.training_state import TrainingState


def restore_published(weights: PolicyWeights, training: TrainingState) -> bool:
    """Load the weights a learner published before it restarted into ``training``, unless its
    checkpoint (already restored) is newer; True if loaded.

    They survive a learner's crash in shared memory (a new run's are unpublished: version 0). A
    publish torn by the crash (odd seqlock counter) is not read, but the version moves past it so
    that versions never go back.
    """
    counter = int(weights.counter[0])
    published = counter // 2 + counter % 2
    if published < max(training.version, 1):
        return False
    if counter % 2:
        training.version = max(training.version, published)
        return False
    weights.read_into(training.policy.published_tensors())
    training.version = published
    return True


MAX_RESTORES_IN_A_ROW = 3
"""Restores of the last good state with no finite update between, after which training has
failed: every step raises (the learner's process then gives up after ``max_failed_batches``)."""


class NumericsGuard:
    """Counts non-finite updates in a row; after ``max_bad`` puts back the last good state;
    after ``MAX_RESTORES_IN_A_ROW`` such restores with nothing finite between, raises.

    The good state (policy with its normalizer, optimizer, returns normalizer: the training
    state's learned part) is copied on its device before a batch every ``every`` batches, if the
    previous batch had no bad update and every weight is finite. Runs on the learner's training
    thread.
    """

    def __init__(self, training: TrainingState, max_bad: int, every: int, log: logging.Logger,
                 name: str, counter: Any = None) -> None:
        self.training = training
        self.max_bad = max_bad
        self.every = max(1, every)
        self.log = log
        self.name = name
        self.counter = counter
        self.bad = 0
        self.restores = 0
        self.restores_in_a_row = 0
        self._batches = 0
        self._clean = True
        self._good: dict[str, Any] | None = None
        self._good_version = 0

    def before_batch(self) -> None:
        """Keep a copy of the state if due and healthy."""
        due = self._good is None or (self._batches % self.every == 0 and self._clean)
        self._batches += 1
        self._clean = True
        if due and self.training.weights_finite():
            self._good = self.training.snapshot()
            self._good_version = self.training.version

    def forget(self) -> None:
        """Drop the copy (the weights were replaced, e.g. by a PBT exchange); the next batch
        takes a new one."""
        self._good = None
        self.bad = 0

    def after_step(self, ok: bool) -> bool:
        """Count one optimizer step; True when this one triggered a restore. Raises
        ``RuntimeError`` once restores alone have followed each other too often."""
        if ok:
            self.bad = self.restores_in_a_row = 0
            return False
        if self.restores_in_a_row >= MAX_RESTORES_IN_A_ROW:
            raise RuntimeError(f"{self.name}: {self.restores_in_a_row} restores of the last good "
                               f"state with no finite update between: training cannot go on")
        self.bad += 1
        self._clean = False
        if self.bad < self.max_bad or self._good is None:
            return False
        self.training.load_learned_state(self._good)  # copies: the good state stays intact
        self.restores += 1
        self.restores_in_a_row += 1
        if self.counter is not None:
            self.counter.inc()
        self.log.warning("%s: %d non-finite updates in a row; restored the last good state "
                         "(weights of version %d)", self.name, self.bad, self._good_version)
        self.bad = 0
        return True
