"""A match is credited to the player its opponent slot held throughout, by weights version."""

from __future__ import annotations

from sfbus_components.league.slot_history import KEPT_VERSIONS, SlotHistory


def test_a_match_counts_against_the_player_of_its_versions_even_after_a_reload() -> None:
    history = SlotHistory(2)
    history.loaded(0, 1, "snapshot:3")
    history.loaded(1, 1, "snapshot:4")
    history.loaded(0, 2, "snapshot:7")  # slot 0 reloaded: matches still in play ran on version 1
    assert history.player(0, (1, 1)) == "snapshot:3"
    assert history.player(0, (2, 2)) == "snapshot:7"
    assert history.player(1, (1, 1)) == "snapshot:4"


def test_a_match_across_a_reload_an_empty_slot_or_unknown_versions_has_no_player() -> None:
    history = SlotHistory(1)
    history.loaded(0, 1, "snapshot:0")
    history.loaded(0, 2, "snapshot:1")
    assert history.player(0, (1, 2)) is None  # half against each
    assert history.player(0, (0, 0)) is None  # the fresh network before the first load
    assert history.player(0, (-1, -1)) is None  # a sender that tracks no versions


def test_only_the_newest_versions_are_kept() -> None:
    history = SlotHistory(1)
    for version in range(1, KEPT_VERSIONS + 11):
        history.loaded(0, version, f"snapshot:{version}")
    assert history.player(0, (10, 10)) is None
    newest = KEPT_VERSIONS + 10
    assert history.player(0, (newest, newest)) == f"snapshot:{newest}"
    assert history.player(0, (11, 11)) == "snapshot:11"
