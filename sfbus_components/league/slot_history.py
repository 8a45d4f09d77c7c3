"""Which player each opponent slot held at each of its weights versions, so that a match is
credited to the snapshot it was played against rather than to the one in the slot when it ends.

The league loads a player into a slot by publishing its weights as the slot's next version; the
inference workers pick that version up at their next pass and the rollout workers report, with
each finished match, the versions the opponent acted with at its first and last step
(``EpisodeFinished.opponent_versions``). Equal versions name one player; a match across a reload
(a long VizDoom duel outliving ``rotate_every_s``) had two and is not a result of either.
"""

from __future__ import annotations

from collections import OrderedDict

KEPT_VERSIONS = 64
"""Versions remembered per slot: far more than a slot is reloaded during one match."""


class SlotHistory:
    """The players of ``slots`` opponent slots by weights version (the newest ``KEPT_VERSIONS``
    of each)."""

    def __init__(self, slots: int) -> None:
        self.held: list[OrderedDict[int, str]] = [OrderedDict() for _ in range(slots)]

    def loaded(self, slot: int, version: int, player: str) -> None:
        """Slot ``slot`` holds ``player`` from weights version ``version`` on."""
        held = self.held[slot]
        held[version] = player
        while len(held) > KEPT_VERSIONS:
            held.popitem(last=False)

    def player(self, slot: int, versions: tuple[int, int]) -> str | None:
        """The player a match was played against, from the opponent's versions at its first
        and last step; None where they differ (a reload in between), are unknown, or name no
        player (an empty slot, a fresh network: version 0)."""
        first, last = versions
        return self.held[slot].get(first) if first == last else None
