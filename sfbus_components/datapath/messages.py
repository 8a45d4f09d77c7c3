"""The payloads the RL components exchange: indices, counters and a few statistics; no tensors."""

from __future__ import annotations

from math import nan
from typing import Annotated, get_origin, get_type_hints

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


class BatcherStarted(Message, frozen=True):
    """The batcher of ``policy`` started as ``epoch``: what older ones held is lost
    (:mod:`sfbus_components.datapath.slot_stages`)."""

    policy: int
    epoch: int


class EpisodeFinished(Message, frozen=True):
    """An agent finished an episode under ``policy`` (the reward is the env's own, unscaled)."""

    policy: int
    episode_return: float
    length: int
    frames: int
    true_return: float = float("nan")
    """The env's score without reward shaping (NaN: the env does not shape, see the return)."""
    win: float = float("nan")
    """A match's outcome: 1.0 when the agent outscored every other agent, else 0.0, or 0.5 for a
    draw where the env reports draws (NaN: no match, the env reports no ``episode_win``)."""
    opponent: int = -1
    """The policy of the other agent of a 1v1 match (-1: none reported)."""
    extra_stats: tuple[tuple[str, float], ...] = ()
    """The numbers the env reported for the episode in ``info["episode_extra_stats"]`` (name,
    value), as in Sample Factory; checked and bounded where the episode ends
    (:func:`sfbus_components.sampling.extra_stats.episode_extra_stats`)."""
    opponent_versions: tuple[int, int] = (-1, -1)
    """The weights versions the opponent acted with at the episode's first step and at its last
    (-1: not known): a league's opponent slot holds one snapshot per version, so a match whose
    slot was reloaded in between had no single opponent."""


class RolloutProgress(Message, frozen=True):
    """Env frames a rollout worker collected since its previous report."""

    worker: int
    frames: int
    policy_frames: tuple[int, ...] = ()
    """The same frames by the policy that acted (index = policy id); empty for one policy."""
    final: bool = False
    """The worker's last report, sent as it stops: every frame it stepped is reported."""


class TrainingResumed(Message, frozen=True):
    """The learner of ``policy`` resumed from a checkpoint at the run's first start: the run's
    frame counts (``--max-frames``, the status line, ``progress.jsonl``) go on from the env
    frames that checkpoint trained on, as Sample Factory's go on from its ``env_steps``."""

    policy: int
    env_frames: int


# Population-based training: the PBT actor (sfbus_components.pbt.trainer) to the learners and
# rollout workers, and the learners back.


class HyperparamsChanged(Message, frozen=True):
    """Every PBT-managed hyperparameter of ``policy`` (the full set, so a repeat is harmless).

    Names are ``appo.<field>`` (the learner's APPO settings, applied to its optimizer too),
    ``reward_scale`` (learner) and ``reward_shaping.<key>`` (applied by rollout workers to the
    envs whose agents act with ``policy``). A receiver ignores the names it does not own.
    """

    policy: int
    names: tuple[str, ...]
    values: tuple[float, ...]


class ReplacePolicy(Message, frozen=True):
    """Exchange ``exchange``: ``policy`` takes the weights and training state of ``source``.

    Sent to every learner. The source's learner writes a snapshot (between two training steps);
    the target's learner waits for it, loads model, optimizer and normalizers together, publishes
    them as its next version and trains only on steps collected from that version on.
    """

    policy: int
    source: int
    exchange: int


class PolicyReplaced(Message, frozen=True):
    """The learner of ``policy`` now trains the copy of ``source`` (exchange ``exchange``).

    ``version`` is the target's first version with the copied weights; ``source_version`` the
    source's version that was copied; ``ok`` is False when the snapshot never came.
    """

    policy: int
    source: int
    exchange: int
    version: int
    source_version: int
    ok: bool = True


class LeagueRatings(Message, frozen=True):
    """The league's Elo ratings of ``policy`` (:mod:`sfbus_components.league`): the policy as it
    trains now, and its newest snapshot (NaN: none yet); PBT's ``league_*`` objectives."""

    policy: int
    rating: float
    snapshot_rating: float = float("nan")


class Figure:
    """What a float field of :class:`TrainingStats` is: its TensorBoard tag (Sample Factory's
    where it has one, so its saved views work) and one line saying what it measures."""

    __slots__ = ("doc", "tag")

    def __init__(self, tag: str, doc: str) -> None:
        self.tag = tag
        self.doc = doc


class TrainingStats(Message, frozen=True):
    """One training step of the learner of ``policy``: its counters, then its figures.

    Every float field is a training figure, declared here once with its :class:`Figure`: the
    loss and the learner return them under these names, and every sink (the status line and
    ``progress.jsonl``, TensorBoard and W&B, Prometheus's ``sfbus_learner_<name>``) iterates
    over :data:`TRAINING_FIGURES`. NaN: not measured this step (every minibatch skipped, or no
    GPU for the GPU's memory)."""

    policy: int
    version: int
    samples: int
    env_frames: int
    loss: Annotated[float, Figure("train/loss", "the minimized loss: policy + weighted value, "
                                  "exploration and KL terms, mean over the minibatches")] = nan
    policy_loss: Annotated[float, Figure(
        "train/policy_loss", "PPO's clipped surrogate loss, mean over the minibatches")] = nan
    value_loss: Annotated[float, Figure(
        "train/value_loss", "critic loss (before value_loss_coeff)")] = nan
    exploration_loss: Annotated[float, Figure(
        "train/exploration_loss",
        "entropy or symmetric-KL exploration loss (before its coefficient)")] = nan
    entropy: Annotated[float, Figure("train/entropy", "policy entropy over valid steps")] = nan
    kl: Annotated[float, Figure(
        "train/kl_divergence", "KL(current || behaviour) over valid steps, before each step "
        "(the adaptive learning-rate schedules read it; kl_loss_coeff weights it as a "
        "penalty)")] = nan
    kl_max: Annotated[float, Figure(
        "train/kl_divergence_max", "largest per-step KL(current || behaviour)")] = nan
    clip_fraction: Annotated[float, Figure(
        "train/fraction_clipped",
        "share of valid steps whose ratio lies outside the clipping range")] = nan
    ratio_deviation: Annotated[float, Figure(
        "train/ratio_mean", "mean |1 - pi / mu| over valid steps")] = nan
    ratio_mean: Annotated[float, Figure(
        "train/ratio_avg", "mean importance ratio pi / mu over valid steps")] = nan
    ratio_min: Annotated[float, Figure(
        "train/ratio_min", "smallest importance ratio of the batch")] = nan
    ratio_max: Annotated[float, Figure(
        "train/ratio_max", "largest importance ratio of the batch")] = nan
    adv_mean: Annotated[float, Figure(
        "train/adv_mean", "mean advantage (before normalisation)")] = nan
    adv_std: Annotated[float, Figure(
        "train/adv_std", "advantage standard deviation (before normalisation)")] = nan
    value_mean: Annotated[float, Figure(
        "train/value", "mean value prediction (normalised-return space)")] = nan
    value_delta: Annotated[float, Figure(
        "train/value_delta", "mean |value - behaviour-time value| over valid steps")] = nan
    value_delta_max: Annotated[float, Figure(
        "train/value_delta_max", "largest |value - behaviour-time value|")] = nan
    target_mean: Annotated[float, Figure(
        "train/target_mean", "mean value target (V-trace or GAE, return space)")] = nan
    valid_fraction: Annotated[float, Figure(
        "train/valids_fraction", "share of the batch's steps trained on (the rest lag too "
        "much or belong to another policy)")] = nan
    lag_mean: Annotated[float, Figure(
        "train/version_diff_avg",
        "mean policy lag (versions) of the policy's steps in the batch")] = nan
    lag_min: Annotated[float, Figure(
        "train/version_diff_min", "smallest policy lag of those steps")] = nan
    lag_p50: Annotated[float, Figure(
        "train/version_diff_p50", "their median policy lag")] = nan
    lag_p90: Annotated[float, Figure(
        "train/version_diff_p90", "their 90th-percentile policy lag")] = nan
    lag_max: Annotated[float, Figure(
        "train/version_diff_max",
        "their largest policy lag (above max_policy_lag: not trained on)")] = nan
    grad_norm: Annotated[float, Figure("train/grad_norm", "gradient norm before clipping")] = nan
    lr: Annotated[float, Figure("train/lr", "learning rate after the batch")] = nan
    obs_running_mean: Annotated[float, Figure(
        "train/obs_running_mean", "the observation statistics' running mean, averaged over "
        "the normalized fields' elements")] = nan
    obs_running_std: Annotated[float, Figure(
        "train/obs_running_std", "their running standard deviation, averaged likewise")] = nan
    returns_running_mean: Annotated[float, Figure(
        "train/returns_running_mean", "the returns statistics' running mean "
        "(normalize_returns)")] = nan
    returns_running_std: Annotated[float, Figure(
        "train/returns_running_std", "their running standard deviation")] = nan
    train_seconds: Annotated[float, Figure(
        "perf/train_seconds", "seconds the batch took to train")] = nan
    learner_fps: Annotated[float, Figure(
        "perf/learner_fps", "env frames trained on per second of training")] = nan
    memory: Annotated[float, Figure(
        "stats/memory_learner", "the learner process's resident memory, MiB")] = nan
    gpu_memory: Annotated[float, Figure(
        "stats/gpu_mem_learner", "GPU memory the learner's tensors hold, MB")] = nan


TRAINING_FIGURES: dict[str, Figure] = {
    name: hint.__metadata__[0]
    for name, hint in get_type_hints(TrainingStats, include_extras=True).items()
    if get_origin(hint) is Annotated}
"""The training figures by field name, in declaration order: what every sink iterates over."""
