"""MuJoCo envs by Sample Factory's names, and continuous actions mapped into the env's Box."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sfbus_components.envs import (
    ActionBox,
    EnvSpec,
    ObsField,
    UnknownEnvError,
    known_envs,
    make_env,
)
from sfbus_components.envs.action_bounds import ActionMap, BoundedActions, bound_actions
from sfbus_components.envs.mujoco.tasks import MUJOCO_ENVS
from sfbus_components.envs.vector import VectorEnvs
from sfbus_components.models import ModelConfig
from sfbus_components.models.policy import Policy


def box_spec(low: tuple[float, ...], high: tuple[float, ...]) -> EnvSpec:
    return EnvSpec({"obs": ObsField((3,), "float32")},
                   action_box=ActionBox(low, high, (len(low),)))


def run(env, actions: list[np.ndarray], seed: int = 7) -> list[tuple]:
    """(obs, reward, terminated, truncated) of each step from a seeded reset."""
    obs = env.spec.empty_obs()
    env.reset_into(obs, seed=seed)
    out = []
    for a in actions:
        r, term, trunc, _ = env.step_into(a, obs)
        out.append((obs["obs"].copy(), float(r[0]), bool(term[0]), bool(trunc[0])))
    return out


def test_every_sample_factory_name_is_a_gymnasium_mujoco_env() -> None:
    assert set(MUJOCO_ENVS) <= set(known_envs())
    assert {"mujoco_halfcheetah", "mujoco_hopper", "mujoco_walker", "mujoco_ant",
            "mujoco_humanoid"} <= set(MUJOCO_ENVS)
    for name in MUJOCO_ENVS:
        with make_env(name, seed=0) as env:
            spec = env.spec
            assert spec.is_continuous and spec.num_agents == 1
            (field,) = spec.observation_space.values()
            assert field.dtype == "float32" and len(field.shape) == 1


def test_mujoco_halfcheetah_is_gymnasiums_halfcheetah() -> None:
    actions = [np.random.default_rng(1).uniform(-1, 1, (1, 6)).astype(np.float32)
               for _ in range(5)]
    with make_env("mujoco_halfcheetah") as ours, make_env("gym:HalfCheetah-v5") as theirs:
        assert ours.spec == theirs.spec
        for a, b in zip(run(ours, actions), run(theirs, actions), strict=True):
            np.testing.assert_array_equal(a[0], b[0])
            assert a[1:] == b[1:]


def test_the_time_limit_truncates_at_max_episode_steps() -> None:
    with make_env("mujoco_halfcheetah", max_episode_steps=3) as env:
        steps = run(env, [np.zeros((1, 6), np.float32)] * 3)
    assert [(term, trunc) for *_, term, trunc in steps] == [(False, False)] * 2 + [(False, True)]


def test_an_unknown_mujoco_name_suggests_the_close_one() -> None:
    with pytest.raises(UnknownEnvError, match="did you mean 'mujoco_halfcheetah'"):
        make_env("mujoco_halfcheeta")


def test_clip_and_squash_are_their_formulas() -> None:
    spec = box_spec((-1.0, 0.0), (3.0, 2.0))
    actions = np.array([[-5.0, 0.5], [2.0, 9.0], [0.0, -0.1]], np.float32)
    low, high = np.array([-1.0, 0.0]), np.array([3.0, 2.0])
    np.testing.assert_array_equal(ActionMap(spec, "clip")(actions),
                                  np.minimum(np.maximum(actions, low), high))
    np.testing.assert_allclose(ActionMap(spec, "squash")(actions),
                               low + (np.tanh(actions) + 1) * (high - low) / 2, rtol=1e-6)
    assert ActionMap(spec, "none")(actions) is actions


def test_squash_onto_an_unbounded_box_is_refused_when_the_policy_is_built() -> None:
    spec = box_spec((-math.inf,), (math.inf,))
    with pytest.raises(ValueError, match="squash needs finite action bounds"):
        Policy(spec, ModelConfig(action_bounds="squash"))
    Policy(spec, ModelConfig(action_bounds="clip"))  # clip is fine


def test_a_discrete_env_is_not_wrapped() -> None:
    with make_env("gym:CartPole-v1") as env:
        assert bound_actions(env, "clip") is env


@pytest.mark.parametrize("mode", ["clip", "squash"])
def test_the_env_gets_the_mapped_action_and_the_buffer_keeps_the_sample(mode: str) -> None:
    sampled = np.array([[3.0, -2.5, 0.3, 0.0, 1.5, -0.9]], np.float32)
    # HalfCheetah's control cost sees the action it gets: the raw sample costs more.
    # (HalfCheetah's Box is [-1, 1]: the squash is tanh, written as the formula rounds it.)
    mapped = (np.clip(sampled, -1, 1) if mode == "clip"
              else np.float32(-1) + (np.tanh(sampled) + np.float32(1)) * np.float32(1))
    envs = [BoundedActions(make_env("mujoco_halfcheetah"), mode)]
    raw, direct = make_env("mujoco_halfcheetah"), make_env("mujoco_halfcheetah")
    try:
        obs = envs[0].spec.empty_obs()
        envs[0].reset_into(obs, seed=7)
        vector = VectorEnvs(envs, 0, 1, 1, lambda *a: None)
        buffer = np.repeat(sampled, 2, axis=0)  # a buffer's step: its rows are views
        rewards, dones, time_outs = np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool)
        vector.step_into(buffer[:1], [obs], rewards, dones, time_outs)
        np.testing.assert_array_equal(buffer[0], sampled[0])  # not mapped in place
        ((expected_obs, expected_reward, *_),) = run(direct, [mapped])
        ((_, raw_reward, *_),) = run(raw, [sampled])
        np.testing.assert_array_equal(obs["obs"], expected_obs)
        assert rewards[0] == pytest.approx(expected_reward)
        assert raw_reward < expected_reward
    finally:
        for env in (*envs, raw, direct):
            env.close()
