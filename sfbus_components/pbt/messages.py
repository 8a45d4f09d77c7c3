"""Payloads of population-based training: hyperparameter changes and weight exchanges."""

from __future__ import annotations

from sfbus import Message


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
