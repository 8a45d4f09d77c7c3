"""Learning-rate schedules of Sample Factory 2.x: constant, linear decay and KL-adaptive.

The KL-adaptive rule (Sample Factory's ``KlAdaptiveScheduler``): with the mean KL divergence
between the behaviour policy and the current one over the last minibatch
(``kl_adaptive_minibatch``) or the last epoch's minibatches (``kl_adaptive_epoch``), the rate
is divided by 1.5 when that mean is above twice ``lr_schedule_kl_threshold`` (never below
``lr_adaptive_min``) and multiplied by 1.5 when it is below half of it (never above
``lr_adaptive_max``). ``linear_decay`` goes from ``lr`` to 0 over the run's ``--max-frames``.
"""

from __future__ import annotations

from typing import Literal

LrScheduleName = Literal["constant", "linear_decay", "kl_adaptive_minibatch", "kl_adaptive_epoch"]
_STEP = 1.5  # Sample Factory's factor, both ways


def kl_adaptive_lr(lr: float, mean_kl: float, threshold: float, low: float, high: float) -> float:
    """The next rate after a mean KL of ``mean_kl`` (Sample Factory's rule, module doc)."""
    if mean_kl > 2.0 * threshold:
        lr = max(lr / _STEP, low)
    if mean_kl < 0.5 * threshold:
        lr = min(lr * _STEP, high)
    return lr


def linear_decay_lr(initial: float, trained_frames: float, max_frames: int) -> float:
    """``initial`` scaled down linearly to 0 at ``max_frames`` env frames trained on."""
    return initial * max(0.0, 1.0 - trained_frames / max_frames)


class LrSchedule:
    """Says the learning rate after each minibatch and each epoch, from the KLs seen so far in
    the current batch and the progress through the run."""

    def __init__(self, name: LrScheduleName, initial: float, kl_threshold: float,
                 low: float, high: float, max_frames: int | None) -> None:
        if name == "linear_decay" and not max_frames:
            raise ValueError("lr_schedule linear_decay decays over the run's --max-frames; "
                             "give --max-frames, or choose another lr_schedule")
        self.name = name
        self.initial = initial
        self.kl_threshold, self.low, self.high = kl_threshold, low, high
        self.max_frames = max_frames

    def after_minibatch(self, lr: float, kls: list[float], trained_frames: float) -> float:
        """The rate for the next minibatch, ``kls`` holding this batch's minibatch KLs so far."""
        if self.name == "kl_adaptive_minibatch":
            return kl_adaptive_lr(lr, kls[-1], self.kl_threshold, self.low, self.high)
        if self.name == "linear_decay":
            assert self.max_frames is not None
            return linear_decay_lr(self.initial, trained_frames, self.max_frames)
        return lr

    def after_epoch(self, lr: float, epoch_kls: list[float]) -> float:
        """The rate for the next epoch, ``epoch_kls`` holding the epoch's minibatch KLs."""
        if self.name == "kl_adaptive_epoch":
            mean_kl = sum(epoch_kls) / len(epoch_kls)
            return kl_adaptive_lr(lr, mean_kl, self.kl_threshold, self.low, self.high)
        return lr
