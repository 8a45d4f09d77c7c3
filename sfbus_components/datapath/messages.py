"""The payloads the RL components exchange: indices, counters and a few statistics; no tensors."""

from __future__ import annotations

import math

from sfbus import Message


class InferenceRequest(Message, frozen=True):
    """Rollout worker ``worker`` wrote ``count`` rows of split ``split`` to its request table.

    The rows' (slot, t) pairs are ``<rollout>.requests[split, offset:offset + count]`` in shared
    memory; the observations and RNN states are in the worker's trajectory buffer at those rows.
    With several policies a split sends one request per policy acting in it, its rows grouped by
    policy in the table (``offset`` is where the group starts); the worker steps the split once
    every group is answered.
    """

    worker: int
    split: int
    count: int
    policy: int
    offset: int = 0
    seq: int = 0
    """Request number of the split: a re-sent request gets a new one (see ``ActionsReady``)."""
    block: int = -1
    """Batched sampling: the rows are slots ``block .. block + count - 1`` at step ``t``, one
    contiguous slice of the buffer (the request table is not read); -1: read the table."""
    t: int = 0
    """Batched sampling: the step the block's rows are at."""


class ActionsReady(Message, frozen=True):
    """The inference worker wrote actions for every row of the request (worker, split)."""

    worker: int
    split: int
    seq: int = 0
    """The answered request's ``seq``: the worker ignores answers to requests it re-sent since
    (0: an answerer that does not echo it, always accepted)."""


class TrajectoryReady(Message, frozen=True):
    """Slot ``slot`` of rollout worker ``worker`` holds T complete steps for ``policy``."""

    worker: int
    slot: int
    policy: int
    epoch: int = 0
    """The newest epoch of ``policy``'s batcher the worker knew (see
    sfbus_components.datapath.slot_stages)."""


class BatchReady(Message, frozen=True):
    """A training batch: trajectory ``i`` is slot ``slots[i]`` of rollout worker ``workers[i]``."""

    policy: int
    workers: tuple[int, ...]
    slots: tuple[int, ...]


class SlotsReleased(Message, frozen=True):
    """The learner copied these slots of rollout worker ``worker``; the worker may reuse them."""

    worker: int
    slots: tuple[int, ...]


class LearnerIdle(Message, frozen=True):
    """The learner of ``policy`` can take the next batch."""

    policy: int


class WeightsUpdated(Message, frozen=True):
    """The learner of ``policy`` published weights ``version`` in shared memory."""

    policy: int
    version: int


class EpisodeFinished(Message, frozen=True):
    """An agent finished an episode under ``policy`` (the reward is the env's own, unscaled)."""

    policy: int
    episode_return: float
    length: int
    frames: int
    true_return: float = float("nan")
    """The env's score without reward shaping (NaN: the env does not shape, see the return)."""
    win: float = float("nan")
    """A match's outcome: 1.0 when the agent outscored every other agent, else 0.0 (NaN: no
    match, the env reports no ``episode_win``)."""
    opponent: int = -1
    """The policy of the other agent of a 1v1 match (-1: none reported)."""


class RolloutProgress(Message, frozen=True):
    """Env frames a rollout worker collected since its previous report."""

    worker: int
    frames: int
    policy_frames: tuple[int, ...] = ()
    """The same frames by the policy that acted (index = policy id); empty for one policy."""


class TrainingStats(Message, frozen=True):
    """One training step of the learner of ``policy``: losses and health figures (every float
    field is one of :data:`TRAINING_FIGURES`, written to TensorBoard and Prometheus)."""

    policy: int
    version: int
    samples: int
    env_frames: int
    policy_loss: float
    value_loss: float
    entropy: float
    kl: float
    grad_norm: float
    lr: float
    lag_mean: float
    lag_max: float
    clip_fraction: float
    train_seconds: float
    exploration_loss: float = math.nan
    ratio_mean: float = math.nan
    ratio_min: float = math.nan
    ratio_max: float = math.nan
    adv_mean: float = math.nan
    adv_std: float = math.nan
    value_mean: float = math.nan
    target_mean: float = math.nan
    valid_fraction: float = math.nan
    lag_min: float = math.nan
    lag_p50: float = math.nan
    lag_p90: float = math.nan
    learner_fps: float = math.nan


TRAINING_FIGURES: dict[str, str] = {
    "policy_loss": "PPO's clipped surrogate loss, mean over the batch's minibatches",
    "value_loss": "critic loss (before value_loss_coeff)",
    "exploration_loss": "entropy or symmetric-KL exploration loss (before its coefficient)",
    "entropy": "policy entropy over valid steps",
    "kl": "KL(current || behaviour) over valid steps, before each step (the adaptive "
          "learning-rate schedules read it; kl_loss_coeff weights it as a penalty)",
    "clip_fraction": "share of valid steps whose ratio lies outside the clipping range",
    "ratio_mean": "mean importance ratio pi / mu over valid steps",
    "ratio_min": "smallest importance ratio of the batch",
    "ratio_max": "largest importance ratio of the batch",
    "adv_mean": "mean advantage (before normalisation)",
    "adv_std": "advantage standard deviation (before normalisation)",
    "value_mean": "mean value prediction (normalised-return space)",
    "target_mean": "mean value target (V-trace or GAE, return space)",
    "valid_fraction": "share of the batch's steps trained on (the rest lag too much or belong "
                      "to another policy)",
    "lag_mean": "mean policy lag (versions) of the policy's steps in the batch",
    "lag_min": "smallest policy lag of those steps",
    "lag_p50": "their median policy lag",
    "lag_p90": "their 90th-percentile policy lag",
    "lag_max": "their largest policy lag (above max_policy_lag: not trained on)",
    "grad_norm": "gradient norm before clipping",
    "lr": "learning rate after the batch",
    "train_seconds": "seconds the batch took to train",
    "learner_fps": "env frames trained on per second of training",
}
"""The learner's figures of a training step, by name (TensorBoard ``policy_<id>/<name>``,
Prometheus ``sfbus_learner_<name>``), with what each is."""
