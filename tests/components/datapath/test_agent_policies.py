"""Heterogeneous agents: agent_policies resolved by name into a policy per agent and a spec per
policy, refused where it does not fit, and the trajectory layout with each policy's own arrays."""

from __future__ import annotations

import pytest

from sfbus_components.datapath.agent_policies import resolve_agent_policies
from sfbus_components.datapath.buffers import TrajectoryLayout, trajectory_layout
from sfbus_components.datapath.settings import DataPathParams, policy_spec
from sfbus_components.envs import EnvSpec, ObsField

NAMES = ("adversary_0", "adversary_1", "adversary_2", "agent_0")
TAG = "pettingzoo:mpe2.simple_tag_v3"
TAG_KWARGS = {"num_good": 1, "num_adversaries": 3, "num_obstacles": 2, "max_cycles": 25}


def one_agent(width: int, heads: tuple[int, ...] = (5,)) -> EnvSpec:
    return EnvSpec({"obs": ObsField((width,), "float32")}, action_heads=heads)


def tag_like() -> EnvSpec:
    """Simple Tag's spaces: predators observe 16 numbers, the prey 14; 5 moves each."""
    agents = (one_agent(16),) * 3 + (one_agent(14),)
    return EnvSpec(agents[0].observation_space, (5,), num_agents=4, frameskip=2,
                   agent_names=NAMES, agent_specs=agents)


def test_patterns_map_every_agent_and_each_policy_gets_its_agents_spaces() -> None:
    table, specs = resolve_agent_policies(tag_like(), {"adversary_*": 0, "agent_*": 1}, 2)
    assert table == (0, 0, 0, 1)
    assert [s.observation_space["obs"].shape for s in specs] == [(16,), (14,)]
    assert [s.num_agents for s in specs] == [3, 1]  # the policy's agents in one env
    assert all(s.frameskip == 2 and not s.heterogeneous for s in specs)


def test_the_first_matching_key_wins() -> None:
    spec = EnvSpec({"obs": ObsField((4,), "float32")}, (3,), num_agents=4, agent_names=NAMES)
    table, specs = resolve_agent_policies(spec, {"adversary_0": 2, "adversary_*": 1, "*": 0}, 3)
    assert table == (2, 1, 1, 0)
    assert [s.num_agents for s in specs] == [1, 2, 1]


def test_without_a_mapping_agents_of_one_space_need_none() -> None:
    spec = EnvSpec({"obs": ObsField((4,), "float32")}, (3,), num_agents=4, agent_names=NAMES)
    assert resolve_agent_policies(spec, {}, 2) == ((), ())


@pytest.mark.parametrize(("patterns", "policies", "message"), [
    ({"adversary_*": 0, "agent_*": 0}, 2,
     r"agent_policies: agent 'agent_0' \(observation \{obs float32 \[14\]\}, actions heads "
     r"\[5\]\) is mapped to policy 0, whose agent 'adversary_0' has observation \{obs float32 "
     r"\[16\]\}.*map 'agent_0' to a policy of its own space"),
    ({"adversary_1": 1, "adversary_*": 0, "agent_0": 1}, 2,
     r"agent 'agent_0' .* is mapped to policy 1, whose agent 'adversary_1'"),
    ({"adversary_*": 0}, 2, r"no key matches agent 'agent_0'; the env's agents are "
                            r"adversary_0, adversary_1, adversary_2, agent_0"),
    ({"adversary_*": 0, "agnet_0": 1}, 2, r"key 'agnet_0' matches none of the env's agents .*"
                                          r"did you mean 'agent_0'\?"),
    ({"adversary_*": 0, "agent_*": 1}, 3, r"policy 2 acts for no agent"),
    ({}, 2, r"the env's agents differ in observation or action space \(adversary_0: "
            r"observation \{obs float32 \[16\]\}.*agent_0: observation \{obs float32 \[14\]\}.*"
            r"\): map each agent to a policy of its space with agent_policies"),
])
def test_a_mapping_that_does_not_fit_is_refused(patterns: dict[str, int], policies: int,
                                                message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_agent_policies(tag_like(), patterns, policies)


def test_an_action_space_differing_is_another_space() -> None:
    spec = EnvSpec({"obs": ObsField((4,), "float32")}, (3,), num_agents=2,
                   agent_names=("speaker", "listener"),
                   agent_specs=(one_agent(4, (3,)), one_agent(4, (5,))))
    with pytest.raises(ValueError, match=r"agent 'listener' \(observation \{obs float32 \[4\]\}, "
                                         r"actions heads \[5\]\) is mapped to policy 0"):
        resolve_agent_policies(spec, {"*": 0, "listener": 1}, 2)


def test_settings_refuse_a_mapping_beyond_the_population() -> None:
    with pytest.raises(ValueError, match=r"agent_policies: 'agent_\*' maps to policy 2, but the "
                                         r"run has policies 0..1"):
        DataPathParams(num_policies=2, agent_policies={"adversary_*": 0, "agent_*": 2})
    with pytest.raises(ValueError, match="num_policies is 1"):
        DataPathParams(agent_policies={"*": 0})


def test_each_policy_has_its_own_observation_and_action_arrays_over_the_workers_slots() -> None:
    params = DataPathParams(env=TAG, env_kwargs=TAG_KWARGS, num_envs=4, rollout=8, batch_size=64,
                            num_policies=2, agent_policies={"adversary_*": 0, "agent_*": 1})
    layout = trajectory_layout(params, workers=1)
    assert layout.agent_policies == (0, 0, 0, 1)
    arrays = {a.name: (a.shape, a.dtype) for a in layout.array_specs("rollout")}
    steps = (layout.slots, 9)
    # what the agents' spaces shape: each policy's own, over every slot of the worker
    assert arrays["rollout.policy0.traj.obs.obs"] == ((*steps, 16), "float32")
    assert arrays["rollout.policy1.traj.obs.obs"] == ((*steps, 14), "float32")
    for policy in (0, 1):
        assert arrays[f"rollout.policy{policy}.traj.actions"] == ((*steps, 1), "int64")
        assert arrays[f"rollout.policy{policy}.traj.action_params"] == ((*steps, 5), "float32")
    # the rest once per worker, as in any run
    assert arrays["rollout.traj.rewards"] == (steps, "float32")
    assert arrays["rollout.requests"] == ((2, 8, 2), "int64")  # 16 agent rows in 2 splits
    assert not [n for n in arrays if n.startswith("rollout.traj.obs") or
                n in ("rollout.traj.actions", "rollout.traj.action_params")]
    # each reader's view: its own spec and names, the worker's for the rest
    view = layout.of_policy(1)
    assert view.spec == policy_spec(params, 1)
    assert view.field_shapes()["obs.obs"] == ((*steps, 14), "float32")
    assert view.array_name("rollout", "obs.obs") == "rollout.policy1.traj.obs.obs"
    assert view.array_name("rollout", "dones") == "rollout.traj.dones"
    assert "obs.obs" not in layout.field_shapes() and "actions" not in layout.field_shapes()


def test_without_agent_policies_the_layout_is_as_before() -> None:
    spec = one_agent(4)
    layout = TrajectoryLayout(spec, 8, 0, 10, 2, 4)
    assert layout.of_policy(1) is layout
    names = [a.name for a in layout.array_specs("w")]
    assert "w.traj.obs.obs" in names and "w.traj.actions" in names
    assert not [n for n in names if "policy" in n]


def test_a_league_beside_agent_policies_is_refused() -> None:
    with pytest.raises(ValueError, match="opponent slots"):
        DataPathParams(num_policies=2, opponent_slots=1, agent_policies={"*": 0, "agent_0": 1})
