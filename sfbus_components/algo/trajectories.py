"""A batch of trajectories under one set of names, from the shared buffer to the gradient.

The learner's batch copy (:mod:`sfbus_components.learning.batch_copy`) gathers each array of the
workers' trajectory buffers (:mod:`sfbus_components.datapath.buffers`) into one tensor keyed as
that array: the observation arrays ``obs.<key>`` as the nested mapping ``obs[key]``, every other
field under its own name. The learner's update and the loss read those same keys; the update
adds what no buffer holds (``valids``, ``learner_version``, GAE's ``targets`` and
``advantages``), and replaces ``obs`` and ``rewards`` by their normalized, scaled versions under
the same names. As Sample Factory's one nested tensor dictionary, adding a buffer field is one
line here, the buffer's layout, and the line of whatever reads it.

Time is axis 1 of every tensor: ``[B, T + 1, ...]`` for ``obs`` (step ``T``, the observation after
the last action, gives the bootstrap value), ``[B, T, ...]`` for the per-step fields (given with
``T + 1`` steps, the buffer's shape, the last is ignored).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from torch import Tensor


class Trajectories(TypedDict):
    """``B`` trajectories of ``T`` steps: the buffer's fields, then what the learner adds."""

    obs: dict[str, Tensor]
    """Observations by key, ``[B, T + 1, ...]`` (the buffer's ``obs.<key>``); in the loss,
    normalized by the policy's ``ObsNormalizer`` (uint8 images: scaled by the model), and
    ``[B, T, ...]`` where GAE's ``targets`` and ``advantages`` already hold V(x_T)."""
    rnn: Tensor
    """The RNN state entering step 0, ``[B, S]``; or entering every step, ``[B, T + 1, S]``
    (needed by ``appo.recurrence`` and by ``gae_targets``)."""
    actions: Tensor
    """``[B, T, heads]`` int64 (discrete) or ``[B, T, dim]`` float (continuous)."""
    log_probs: Tensor
    """``[B, T]`` log mu(a|x) of the behaviour policy."""
    action_params: Tensor
    """``[B, T, n]`` the behaviour distribution's parameters (``ActionDistribution.params``)."""
    values: Tensor
    """``[B, T]`` the behaviour-time values (normalized space: GAE's values, and the centre of
    value clipping)."""
    rewards: Tensor
    """``[B, T]`` the reward after step t's action; in the loss, scaled by ``reward_scale`` and
    the env's scale and clipped to ``appo.reward_clip``."""
    dones: Tensor
    """``[B, T]`` the episode ended after step t (terminated or truncated: both stop the
    bootstrap)."""
    time_outs: NotRequired[Tensor]
    """``[B, T]`` the episode was truncated, not terminated, after step t (needed with
    ``appo.value_bootstrap``)."""
    versions: NotRequired[Tensor]
    """``[B, T]`` the weights version that acted; with ``learner_version``, steps lagging more
    than ``appo.max_policy_lag`` are masked out of every loss."""
    policies: NotRequired[Tensor]
    """``[B, T]`` the policy id that acted (the learner's ``valids`` keep its own policy's)."""
    inactive: NotRequired[Tensor]
    """``[B, T]`` 1 where the agent did not act (a multi-agent env's ``is_active`` False)."""
    valids: NotRequired[Tensor]
    """``[B, T]`` bool, the learner's: the steps to train on (this policy's, by an active agent);
    masked steps still feed V-trace's recursion."""
    learner_version: NotRequired[int]
    """The learner's weights version, which ``versions`` lag behind."""
    targets: NotRequired[Tensor]
    """``[B, T]`` GAE's value targets for the whole batch (``gae_targets``, V-trace off)."""
    advantages: NotRequired[Tensor]
    """``[B, T]`` GAE's advantages for the whole batch, beside ``targets``."""


STEP_KEYS = tuple(key for key in Trajectories.__annotations__
                  if key not in ("obs", "rnn", "learner_version"))
"""The per-step fields (``[B, T, ...]``, or the buffer's ``T + 1`` steps)."""
