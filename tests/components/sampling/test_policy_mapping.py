"""Agent-to-policy mapping: the mappings, request groups, switches and trajectory owners."""

from __future__ import annotations

import numpy as np
import pytest

from sfbus_components.sampling.policy_mapping import (
    AgentPolicies,
    RandomMapping,
    RoundRobinMapping,
    SplitGroups,
    load_mapping,
    trajectory_owners,
)


def test_random_mapping_is_uniform_and_seeded() -> None:
    def draws(worker: int, n: int) -> list[int]:
        mapping = RandomMapping(4, worker=worker, seed=2)
        return [mapping.assign(e % 8, 0, e) for e in range(n)]

    many = np.array(draws(1, 4000))
    assert np.bincount(many, minlength=4) / len(many) == pytest.approx([0.25] * 4, abs=0.03)
    assert draws(1, 20) == many[:20].tolist()  # same seed and worker: the same draws
    assert draws(2, 20) != many[:20].tolist()


def test_round_robin_mapping() -> None:
    mapping = RoundRobinMapping(3, worker=1)
    assert [mapping.assign(0, 0, e) for e in range(4)] == [1, 2, 0, 1]
    assert mapping.assign(2, 1, 0) == 1


def test_load_mapping_by_import_path() -> None:
    mapping = load_mapping("sfbus_components.sampling.policy_mapping:RoundRobinMapping", 5, 0, 0)
    assert isinstance(mapping, RoundRobinMapping) and mapping.num_policies == 5
    with pytest.raises(ValueError, match=r"policy_mapping: expected 'package\.module:Name'"):
        load_mapping("sfbus_components.sampling.policy_mapping.RandomMapping", 2, 0, 0)
    with pytest.raises(ValueError, match="has no attribute 'RandomMaping'; did you mean"):
        load_mapping("sfbus_components.sampling.policy_mapping:RandomMaping", 2, 0, 0)


def test_split_groups_are_contiguous_by_policy() -> None:
    groups = SplitGroups(8, np.array([2, 0, 2, 1, 0, 2]), num_policies=4)
    assert groups.groups == [(0, 0, 2), (1, 2, 1), (2, 3, 3)]
    assert groups.rows.tolist() == [9, 12, 11, 8, 10, 13]
    assert groups.counts.tolist() == [2, 1, 3, 0]


def test_trajectory_owner_is_the_majority_ties_to_the_last_step() -> None:
    steps = np.array([[0, 0, 0, 1],   # majority 0
                      [0, 1, 1, 1],   # majority 1
                      [2, 2, 3, 3],   # tie: the policy acting at the end
                      [3, 3, 2, 2],
                      [1, 1, 1, 1]])
    assert trajectory_owners(steps, 4).tolist() == [0, 1, 3, 2, 1]


class Scripted:
    """A mapping returning scripted policies per (env, agent, episode)."""

    def __init__(self, script: dict[tuple[int, int, int], int]) -> None:
        self.script = script

    def assign(self, env_index: int, agent_index: int, episode: int) -> int:
        """The scripted policy, or 0."""
        return self.script.get((env_index, agent_index, episode), 0)


def test_agent_policies_switch_at_episode_starts() -> None:
    # 4 envs x 2 agents in 2 splits: rows 0-3 split 0, rows 4-7 split 1
    script = {(0, 1, 0): 1, (2, 0, 0): 2, (0, 1, 1): 1, (2, 0, 1): 0}
    agents = AgentPolicies(Scripted(script), 3, num_envs=4, num_agents=2, splits=2)
    assert agents.policy.tolist() == [0, 1, 0, 0, 2, 0, 0, 0]
    assert agents.groups(1).groups == [(0, 0, 3), (2, 3, 1)]
    agents.count_frames(1, 4)
    assert agents.take_frames() == (12, 0, 4) and agents.take_frames() == (0, 0, 0)

    agents.ended.extend([1, 4])  # env 0 agent 1 keeps policy 1; env 2 agent 0 switches to 0
    assert agents.switch() == [4]
    assert agents.policy.tolist() == [0, 1, 0, 0, 0, 0, 0, 0] and agents.episodes[4] == 1
    assert agents.switched == [False, True]
    assert agents.groups(1).groups == [(0, 0, 4)]  # rebuilt
    # split 1's slots mixed 2 then 0: each goes to its majority, then the flag clears
    steps = np.array([[2, 2, 2, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert agents.owners(1, steps) == [2, 0, 0, 0]
    assert agents.switched == [False, False]
    assert agents.owners(1, steps) == [0, 0, 0, 0]  # unmixed: the current policies


def test_a_mapping_outside_the_population_is_an_error() -> None:
    with pytest.raises(ValueError, match="returned policy 3"):
        AgentPolicies(Scripted({(0, 0, 0): 3}), 3, num_envs=1, num_agents=1, splits=1)
