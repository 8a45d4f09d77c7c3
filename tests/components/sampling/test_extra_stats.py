"""What an env may report in ``info["episode_extra_stats"]``: bounded where the episode ends."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from sfbus import RateLimitedLog
from sfbus_components.sampling import extra_stats
from sfbus_components.sampling.extra_stats import (
    MAX_EXTRA_STATS,
    MAX_NAME_LENGTH,
    episode_extra_stats,
)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch) -> None:
    """A warning limiter of the test's own (the module's remembers other tests' warnings)."""
    monkeypatch.setattr(extra_stats, "_warn", RateLimitedLog(extra_stats._warn.logger, 60.0))


def test_numbers_by_name_numpy_scalars_included() -> None:
    info = {"episode_extra_stats": {"kills": np.float32(3.5), "level/reached": np.int64(2),
                                    "won": True, "time": 12}}
    assert episode_extra_stats(info) == (("kills", 3.5), ("level/reached", 2.0), ("won", 1.0),
                                         ("time", 12.0))
    assert episode_extra_stats({}) == () and episode_extra_stats({"episode_extra_stats": {}}) == ()


def test_bad_entries_are_dropped_and_warned_about_once(caplog) -> None:
    bad = {"nan": float("nan"), "inf": float("inf"), "text": "3", "array": np.ones(2),
           "bad name": 1.0, "x" * (MAX_NAME_LENGTH + 1): 1.0, 7: 1.0, "ok": 1.0}
    with caplog.at_level(logging.WARNING):
        for _ in range(50):  # fifty episodes: one warning per kind of fault, not fifty
            assert episode_extra_stats({"episode_extra_stats": bad}) == (("ok", 1.0),)
        assert episode_extra_stats({"episode_extra_stats": [1.0]}) == ()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages  # a value, a name, a type
    assert "episode_extra_stats['nan'] = nan dropped: not a finite number" in messages


def test_at_most_the_bound_of_names(caplog) -> None:
    many = {f"s{n}": float(n) for n in range(MAX_EXTRA_STATS + 3)}
    with caplog.at_level(logging.WARNING):
        kept = episode_extra_stats({"episode_extra_stats": many})
    assert [name for name, _ in kept] == [f"s{n}" for n in range(MAX_EXTRA_STATS)]
