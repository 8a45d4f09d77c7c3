"""The league's mapping: agent 0 trains; the others meet the latest at the ratio, else a slot."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sfbus_components.league.mapping import LeagueMapping
from sfbus_components.sampling.policy_mapping import load_mapping


def test_agent_0_trains_and_the_opponents_follow_the_ratio() -> None:
    mapping = LeagueMapping(3, worker=1, seed=5, opponent_slots=2, latest_ratio=0.25)
    learners = [mapping.assign(e, 0, n) for e in range(4) for n in range(500)]
    assert set(learners) == {0, 1, 2}
    opponents = np.array([mapping.assign(e, 1, n) for e in range(4) for n in range(2500)])
    assert np.mean(opponents < 3) == pytest.approx(0.25, abs=0.02)
    assert set(opponents[opponents >= 3].tolist()) == {3, 4}
    assert np.mean(opponents == 3) == pytest.approx(0.375, abs=0.02)


def test_the_rollout_worker_builds_it_with_the_runs_slots() -> None:
    mapping = load_mapping("sfbus_components.league.mapping:LeagueMapping", 1, 0, 0,
                           opponent_slots=2, options={"latest_ratio": 0.0})
    assert isinstance(mapping, LeagueMapping) and mapping.opponent_slots == 2
    assert {mapping.assign(0, 1, n) for n in range(100)} == {1, 2}
    with pytest.raises(ValueError, match="needs opponent slots"):
        load_mapping("sfbus_components.league.mapping:LeagueMapping", 1, 0, 0)
    with pytest.raises(ValueError, match=re.escape(
            "policy_mapping 'sfbus_components.sampling.policy_mapping:RandomMapping' with "
            "{'opponent_slots': 2}: ")):
        load_mapping("sfbus_components.sampling.policy_mapping:RandomMapping", 1, 0, 0, 2)
