"""The payloads the RL components exchange: indices, counters and a few statistics; no tensors."""

from __future__ import annotations

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
    components.datapath.slot_stages)."""


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
    """One training step of the learner of ``policy``: losses and health figures."""

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
