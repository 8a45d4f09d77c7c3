"""The PettingZoo adapter against the raw parallel envs it wraps (MPE Simple Spread, Knights
Archers Zombies, Rock Paper Scissors) stepped with the same seeds and actions, and on a parallel
env of this module whose agents leave one by one (a user's own env by import path)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pettingzoo
import pytest
from gymnasium import spaces
from mpe2 import simple_spread_v3, simple_tag_v3

from sfbus_components.envs import UnknownEnvError, make_env
from sfbus_components.envs.pettingzoo.adapter import AgentSpacesError

CARTPOLE = Path(__file__).parents[3] / "topologies" / "cartpole.yaml"


def test_rows_are_possible_agents_in_order_and_match_the_raw_env() -> None:
    env = make_env("pettingzoo:mpe2.simple_spread_v3", N=3, max_cycles=10)
    raw = simple_spread_v3.parallel_env(N=3, max_cycles=10)
    assert env.agents == tuple(raw.possible_agents) == ("agent_0", "agent_1", "agent_2")
    assert env.spec.num_agents == 3 and env.spec.action_heads == (5,)
    buf = env.spec.empty_obs()
    env.reset_into(buf, seed=7)
    raw_obs, _ = raw.reset(seed=7)
    rng = np.random.default_rng(0)
    returns = dict.fromkeys(raw.possible_agents, 0.0)
    episodes = 0
    for step in range(1, 31):  # three whole episodes
        # every agent's own position is in its observation: a permuted row would differ
        for i, agent in enumerate(raw.possible_agents):
            np.testing.assert_array_equal(buf["obs"][i], raw_obs[agent])
        actions = rng.integers(5, size=(3, 1))
        rewards, terminated, truncated, infos = env.step_into(actions, buf)
        raw_obs, raw_rewards, raw_terms, raw_truncs, _ = raw.step(
            {a: int(actions[i, 0]) for i, a in enumerate(raw.possible_agents)})
        for i, agent in enumerate(raw.possible_agents):
            assert rewards[i] == np.float32(raw_rewards[agent])
            assert terminated[i] == raw_terms[agent] and truncated[i] == raw_truncs[agent]
            assert infos[i]["is_active"]
            returns[agent] += raw_rewards[agent]
        if raw.agents:
            assert not any("episode_return" in info for info in infos)
            continue
        episodes += 1
        assert step % 10 == 0 and truncated.all()
        for i, agent in enumerate(raw.possible_agents):
            assert infos[i]["episode_return"] == pytest.approx(returns[agent])
            assert infos[i]["episode_length"] == infos[i]["episode_frames"] == 10
            returns[agent] = 0.0
        raw_obs, _ = raw.reset()  # the adapter reset inside its step, unseeded, the same way
    assert episodes == 3
    env.close()
    raw.close()


def test_an_agent_that_leaves_early_stays_inactive_until_the_env_resets() -> None:
    # Knights Archers Zombies drops an agent that a zombie reaches; the others play on.
    env = make_env("pettingzoo:butterfly/knights_archers_zombies")
    raw = pettingzoo.make("parallel", "butterfly/knights_archers_zombies")
    agents = raw.possible_agents
    buf = env.spec.empty_obs()
    env.reset_into(buf, seed=3)
    raw_obs, _ = raw.reset(seed=3)
    rng = np.random.default_rng(3)
    returns = dict.fromkeys(agents, 0.0)
    lengths = dict.fromkeys(agents, 0)
    departed: set[str] = set()
    while True:
        live = list(raw.agents)
        actions = rng.integers(6, size=(len(agents), 1))
        rewards, terminated, truncated, infos = env.step_into(actions, buf)
        raw_obs, raw_rewards, raw_terms, raw_truncs, _ = raw.step(
            {a: int(actions[i, 0]) for i, a in enumerate(agents) if a in live})
        for i, agent in enumerate(agents):
            info = infos[i]
            if agent not in live:  # left in an earlier step: a terminal step of return 0
                assert rewards[i] == 0.0 and terminated[i] and not truncated[i]
                assert not info["is_active"] and "episode_return" not in info
                if raw.agents:
                    assert not buf["obs"][i].any()
                continue
            assert info["is_active"]
            assert rewards[i] == np.float32(raw_rewards[agent])
            assert terminated[i] == raw_terms[agent] and truncated[i] == raw_truncs[agent]
            returns[agent] += raw_rewards[agent]
            lengths[agent] += 1
            if agent in raw.agents:
                np.testing.assert_array_equal(buf["obs"][i], raw_obs[agent].astype(np.float32))
                assert "episode_return" not in info
            else:  # left in this step: its episode is reported now
                assert raw_terms[agent] or raw_truncs[agent]
                assert info["episode_return"] == pytest.approx(returns[agent])
                assert info["episode_length"] == lengths[agent]
                if raw.agents:
                    departed.add(agent)
                    assert not buf["obs"][i].any()
        if not raw.agents:
            break
    assert departed, "no agent left before the others: the case under test did not happen"
    # The env has reset: every row holds the next episode's first observation and acts again.
    raw_obs, _ = raw.reset()
    for i, agent in enumerate(agents):
        np.testing.assert_array_equal(buf["obs"][i], raw_obs[agent].astype(np.float32))
    _, _, _, infos = env.step_into(np.zeros((len(agents), 1), np.int64), buf)
    assert all(info["is_active"] for info in infos)
    env.close()
    raw.close()


def test_discrete_observations_are_one_hot_and_registry_ids_resolve() -> None:
    env = make_env("pettingzoo:classic/rps", max_cycles=4)  # unversioned: the latest, v2
    raw = pettingzoo.make("parallel", "classic/rps-v2", max_cycles=4)
    assert env.spec.observation_space["obs"].shape == (4,)  # Discrete(4): the last moves seen
    buf = env.spec.empty_obs()
    env.reset_into(buf, seed=0)
    raw_obs, _ = raw.reset(seed=0)
    for step in range(6):
        for i, agent in enumerate(raw.possible_agents):
            np.testing.assert_array_equal(buf["obs"][i], np.eye(4)[int(raw_obs[agent])])
        actions = np.array([[step % 3], [(step + 1) % 3]])
        rewards, _, truncated, _ = env.step_into(actions, buf)
        raw_obs, raw_rewards, *_ = raw.step({"player_0": step % 3, "player_1": (step + 1) % 3})
        assert rewards.tolist() == [raw_rewards["player_0"], raw_rewards["player_1"]]
        assert rewards.sum() == 0 and rewards[1] == 1  # the second player's move beats the first
        if not raw.agents:
            assert step == 3 and truncated.all()
            raw_obs, _ = raw.reset()
    env.close()
    raw.close()


class Relay(pettingzoo.ParallelEnv):
    """Agent k earns k + 1 a step, sees (t, k) and leaves after its step k + 1."""

    metadata = {"name": "relay"}

    def __init__(self, num_agents: int = 3) -> None:
        self.possible_agents = [f"runner_{k}" for k in range(num_agents)]
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-100, 100, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents)  # no action for an agent that has left
        self.t += 1
        k = {a: self.possible_agents.index(a) for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        rewards = {a: float(k[a] + 1) for a in self.agents}
        terms = {a: self.t == k[a] + 1 for a in self.agents}
        self.agents = [a for a in self.agents if not terms[a]]
        return obs, rewards, terms, dict.fromkeys(terms, False), {a: {"t": self.t} for a in obs}

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)


def test_own_parallel_env_by_import_path_follows_the_leaving_rule() -> None:
    env = make_env(f"pettingzoo:{__name__}:Relay", num_agents=3)
    buf = env.spec.empty_obs()
    env.reset_into(buf)
    np.testing.assert_array_equal(buf["obs"], [[0, 0], [0, 1], [0, 2]])
    rows = []
    for _ in range(4):
        rewards, terminated, _, infos = env.step_into(np.zeros((3, 1), np.int64), buf)
        rows.append((rewards.tolist(), terminated.tolist(), buf["obs"].tolist(),
                     [info["is_active"] for info in infos],
                     [info.get("episode_return") for info in infos]))
    assert rows == [
        # runner_0 leaves: reported finished, its row zeroed
        ([1, 2, 3], [True, False, False], [[0, 0], [1, 1], [1, 2]], [True] * 3,
         [1.0, None, None]),
        ([0, 2, 3], [True, True, False], [[0, 0], [0, 0], [2, 2]], [False, True, True],
         [None, 4.0, None]),
        # runner_2 leaves last: the env resets and every row gets a first observation
        ([0, 0, 3], [True, True, True], [[0, 0], [0, 1], [0, 2]], [False, False, True],
         [None, None, 9.0]),
        ([1, 2, 3], [True, False, False], [[0, 0], [1, 1], [1, 2]], [True] * 3,
         [1.0, None, None]),
    ]
    assert infos[1]["t"] == 1  # the env's own info comes along


@pytest.mark.parametrize(("name", "message"), [
    ("pettingzoo:butterfly/pistonbal", "did you mean 'pettingzoo:butterfly/pistonball-v6'"),
    ("pettingzoo:sisl.multiwalker_v9", "did you mean 'pettingzoo:sisl/multiwalker-v9'"),
    ("pettingzoo:classic/chess", "PettingZoo has it as an AEC env only"),
    ("pettingzoo:mpe2.simple_spread_v3:nothing", "module 'mpe2.simple_spread_v3' has no "
                                                 "callable 'nothing'"),
])
def test_unknown_names_say_what_exists(name: str, message: str) -> None:
    with pytest.raises(UnknownEnvError, match=message):
        make_env(name)


def test_an_aec_env_is_refused() -> None:
    with pytest.raises(AgentSpacesError, match="not a PettingZoo ParallelEnv"):
        make_env("pettingzoo:mpe2.simple_spread_v3:env")


def test_agents_of_different_spaces_make_a_heterogeneous_env() -> None:
    # Simple Tag: 3 predators see 16 numbers, the prey 14; one array or dict per agent.
    env = make_env("pettingzoo:mpe2.simple_tag_v3", num_good=1, num_adversaries=3,
                   num_obstacles=2, max_cycles=10)
    raw = simple_tag_v3.parallel_env(num_good=1, num_adversaries=3, num_obstacles=2,
                                     max_cycles=10)
    spec = env.spec
    assert spec.heterogeneous and spec.agent_names == tuple(raw.possible_agents)
    assert [s.observation_space["obs"].shape for s in spec.agent_specs] == [(16,)] * 3 + [(14,)]
    assert all(s.action_heads == (5,) for s in spec.agent_specs)
    obs = env.reset(seed=3)
    raw_obs, _ = raw.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(12):  # past an episode's end: the reset inside the step writes per agent too
        for i, agent in enumerate(raw.possible_agents):
            np.testing.assert_array_equal(obs[i]["obs"], raw_obs[agent])
        actions = [rng.integers(5, size=1) for _ in raw.possible_agents]
        obs, rewards, _, truncated, _ = env.step(actions)
        raw_obs, raw_rewards, _, raw_truncated, _ = raw.step(
            {a: int(actions[i][0]) for i, a in enumerate(raw.possible_agents)})
        if not raw.agents:
            raw_obs, _ = raw.reset()
        np.testing.assert_array_equal(rewards, [raw_rewards[a] for a in raw.possible_agents])
        assert truncated.tolist() == [raw_truncated[a] for a in raw.possible_agents]
    speaker = make_env("pettingzoo:mpe2.simple_speaker_listener_v4").spec
    assert [(s.observation_space["obs"].shape, s.action_heads) for s in speaker.agent_specs] \
        == [((3,), (3,)), ((11,), (5,))]  # the action spaces differ too


def test_a_heterogeneous_env_without_agent_policies_is_a_located_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "validate", str(CARTPOLE),
         "--set", "env=pettingzoo:mpe2.simple_speaker_listener_v4"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert re.match(r"error: \S+\.yaml:\d+:\d+: ", line), line
    assert ("the env's agents differ in observation or action space (speaker_0: observation "
            "{obs float32 [3]}, actions heads [3]; listener_0: observation {obs float32 [11]}, "
            "actions heads [5]): map each agent to a policy of its space with agent_policies"
            ) in line, line
