"""Env interface tests on real VizDoom, gymnasium and the toy multi-agent env (a few seconds)."""

from __future__ import annotations

import math
import os
import signal

import cv2
import numpy as np
import pytest
import vizdoom as vzd

from sfbus_components.envs import (
    EnvError,
    EnvSpec,
    ObsField,
    UnknownEnvError,
    env_spec,
    make_env,
)
from sfbus_components.envs.doom import spaces as ds
from sfbus_components.envs.doom.game import DoomEnvError

RNG = np.random.default_rng(0)


def random_actions(spec: EnvSpec) -> np.ndarray:
    return np.array([[RNG.integers(h) for h in spec.action_heads]
                     for _ in range(spec.num_agents)], np.int64)


def run_until_done(env, max_steps: int, action=None):
    buf = env.spec.empty_obs()
    env.reset_into(buf)
    for step in range(1, max_steps + 1):
        a = random_actions(env.spec) if action is None else action
        _, terminated, truncated, infos = env.step_into(a, buf)
        if terminated[0] or truncated[0]:
            return step, terminated, truncated, infos, buf
    raise AssertionError(f"no episode end within {max_steps} steps")


# --- VizDoom ---------------------------------------------------------------------------------

def test_doom_basic_spec_simple():
    spec = env_spec("doom_basic")
    assert spec.observation_space == {"obs": ObsField((3, 72, 128), "uint8")}
    assert spec.action_heads == (4,)  # no-op + MOVE_LEFT, MOVE_RIGHT, ATTACK alone
    assert (spec.num_agents, spec.frameskip, spec.action_box) == (1, 4, None)
    assert env_spec("doom_basic") is spec  # cached per process


def test_doom_basic_spec_full_matches_table_a4():
    spec = env_spec("doom_basic", action_space="full")
    assert spec.action_heads == (3, 3, 2, 2, 2, 8, 21)
    assert math.prod(spec.action_heads) == 12096
    assert spec.observation_space["measurements"] == ObsField((19,), "float32")
    assert spec.action_shape == (7,) and spec.action_dtype == "int64"


def test_full_action_table_every_head_index_zero_is_noop():
    table = ds.full_action_table()
    assert [len(h) for h in table] == list(ds.FULL_ACTION_HEADS)
    assert all(h[0] is None for h in table)
    aims = sorted(v for _, v in table[-1][1:])
    assert aims == [1.25 * k for k in range(-10, 11) if k != 0]


def test_doom_reset_step_shapes_dtypes_ranges():
    with make_env("doom_basic", action_space="full", seed=1) as env:
        obs = env.reset()
        assert len(obs) == 1 and set(obs[0]) == {"obs", "measurements"}
        for _ in range(5):
            obs, rewards, terminated, truncated, infos = env.step(random_actions(env.spec))
        frame, meas = obs[0]["obs"], obs[0]["measurements"]
        assert frame.shape == (3, 72, 128) and frame.dtype == np.uint8 and frame.max() > 0
        assert meas.shape == (19,) and meas.dtype == np.float32
        assert np.all(np.isfinite(meas)) and np.all(np.abs(meas) <= 2.0)
        assert meas[0] == 1.0  # full health, 100 / 100
        assert rewards.dtype == np.float32 and rewards.shape == (1,)
        assert terminated.dtype == bool and truncated.dtype == bool and len(infos) == 1


def test_doom_basic_auto_resets_at_timeout():
    with make_env("doom_basic", seed=3) as env:
        noop = np.zeros((1, 1), np.int64)
        steps, terminated, truncated, infos, buf = run_until_done(env, 100, noop)
        assert truncated[0] and not terminated[0]  # 300-tic timeout, the monster survives
        info = infos[0]
        assert info["episode_length"] == steps and 70 <= steps <= 76
        assert info["episode_frames"] == 4 * steps
        assert info["episode_return"] == pytest.approx(info["episode_true_return"])
        assert info["episode_return"] < 0  # basic's living reward is -1 per tic
        assert buf["obs"].max() > 0  # first frame of the next episode
        for step in range(1, 100):  # the next episode counts from zero again
            _, _, truncated, infos = env.step_into(noop, buf)
            if truncated[0]:
                assert infos[0]["episode_length"] == steps == step
                break


def test_step_into_writes_into_caller_rows():
    with make_env("doom_basic", action_space="full") as env:
        shared = {"obs": np.zeros((4, 1, 3, 72, 128), np.uint8),
                  "measurements": np.zeros((4, 1, 19), np.float32)}
        rows = {k: v[2] for k, v in shared.items()}  # like a rollout worker's slot row
        env.reset_into(rows)
        shared["obs"][2] = 0
        env.step_into(random_actions(env.spec), rows)
        assert shared["obs"][2].max() > 0 and shared["measurements"][2, 0, 0] == 1.0
        assert shared["obs"][[0, 1, 3]].max() == 0 and shared["measurements"][[0, 1, 3]].max() == 0


def test_doom_native_and_resized_frames_agree():
    native = make_env("doom_basic", resolution=None, seed=5)
    small = make_env("doom_basic", seed=5, interpolation="area")
    try:
        big, little = native.reset()[0]["obs"], small.reset()[0]["obs"]
        assert big.shape == (3, 120, 160)
        expected = cv2.resize(big.transpose(1, 2, 0), (128, 72), interpolation=cv2.INTER_AREA)
        diff = np.abs(expected.transpose(2, 0, 1).astype(int) - little.astype(int))
        assert diff.mean() < 2.0  # same channel order and layout on both paths
    finally:
        native.close()
        small.close()


def _children() -> set[int]:
    pids: set[int] = set()
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{tid}/children") as f:
            pids.update(int(p) for p in f.read().split())
    return pids


def test_dead_engine_raises_env_error():
    before = _children()
    env = make_env("doom_basic")
    buf = env.spec.empty_obs()
    env.reset_into(buf)
    engine = _children() - before
    assert engine, "no VizDoom child process found"
    for pid in engine:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(DoomEnvError, match="recreate the env") as err:
        for _ in range(10):
            env.step_into(np.zeros((1, 1), np.int64), buf)
    assert isinstance(err.value, EnvError)
    env.close()


def test_bots_need_a_deathmatch_scenario():
    with pytest.raises(ValueError, match="single-player"):
        make_env("doom_basic", num_bots=1)


def test_unknown_reward_shaping_key():
    with pytest.raises(ValueError, match="unknown reward_shaping keys"):
        make_env("doom_basic", reward_shaping={"fragz": 1.0})


def test_deathmatch_with_one_bot_steps():
    if not os.path.exists(os.path.join(vzd.scenarios_path, "cig.wad")):
        pytest.skip("this vizdoom build ships no cig.wad, the map doom_deathmatch plays on")
    with make_env("doom_deathmatch", action_space="full", num_bots=1, seed=0) as env:
        assert env.reward_shaping == ds.DEATHMATCH_SHAPING
        env.reward_shaping["frag"] = 2.0  # PBT mutates in place; must not raise
        buf = env.spec.empty_obs()
        env.reset_into(buf)
        for _ in range(20):
            rewards, terminated, truncated, _ = env.step_into(random_actions(env.spec), buf)
            assert np.isfinite(rewards[0]) and not (terminated[0] or truncated[0])
        assert buf["measurements"][0, 5] * 8 == pytest.approx(2)  # PLAYER_COUNT: us + 1 bot


# --- gymnasium, toy multi-agent, registry -------------------------------------------------------

def test_gym_cartpole_adapter():
    with make_env("gym:CartPole-v1", seed=0) as env:
        assert env.spec.observation_space == {"obs": ObsField((4,), "float32")}
        assert env.spec.action_heads == (2,) and env.spec.frameskip == 1
        steps, _, _, infos, buf = run_until_done(env, 600)
        assert infos[0]["episode_length"] == steps
        assert infos[0]["episode_return"] == pytest.approx(steps)  # +1 per step
        assert buf["obs"].dtype == np.float32 and np.abs(buf["obs"]).max() < 0.1  # fresh start


def test_gym_box_actions():
    with make_env("gym:Pendulum-v1", seed=0) as env:
        box = env.spec.action_box
        assert box.low == (-2.0,) and box.high == (2.0,) and box.shape == (1,)
        assert env.spec.action_shape == (1,) and env.spec.action_dtype == "float32"
        env.reset()
        obs, rewards, *_ = env.step(np.array([[0.5]], np.float32))
        assert obs[0]["obs"].shape == (3,) and rewards[0] <= 0


def test_toy_multi_agent_env():
    with make_env("toy_multi_agent", num_agents=3, episode_length=5, seed=0) as env:
        assert env.spec.num_agents == 3
        buf = env.spec.empty_obs()
        env.reset_into(buf)
        assert buf["obs"].shape == (3, 4) and np.all(buf["obs"] == buf["obs"][0])
        for _ in range(5):
            target = int(buf["obs"][0].argmax())
            actions = np.array([[target], [target], [(target + 1) % 4]])
            rewards, terminated, truncated, infos = env.step_into(actions, buf)
            assert rewards.tolist() == [1.0, 1.0, 0.0]
        assert truncated.all() and not terminated.any()
        assert [i["episode_return"] for i in infos] == [5.0, 5.0, 0.0]


def test_make_env_by_import_path():
    with make_env("sfbus_components.envs.multi_agent:make_toy_env", num_agents=2) as env:
        assert env.spec.num_agents == 2


@pytest.mark.parametrize(("name", "suggestion"), [
    ("doom_basik", "did you mean 'doom_basic'"),
    ("doom_defend_the_centre", "did you mean 'doom_defend_the_center'"),
    ("gym:CartPol-v1", "did you mean 'gym:CartPole-v1'"),
    ("toy_multiagent", "did you mean 'toy_multi_agent'"),
])
def test_unknown_env_suggests_close_names(name, suggestion):
    with pytest.raises(UnknownEnvError, match=suggestion):
        make_env(name)


def test_unknown_env_lists_known_names():
    with pytest.raises(UnknownEnvError) as err:
        make_env("zzz")
    assert "doom_basic" in str(err.value) and "gym:<EnvId>" in str(err.value)
    with pytest.raises(UnknownEnvError, match="has no attribute 'nope'"):
        make_env("sfbus_components.envs.multi_agent:nope")
    with pytest.raises(UnknownEnvError, match=r"not callable \(its type is int\)"):
        make_env("sfbus_components.envs.atari.game:_FIRE")


def test_env_spec_validation():
    with pytest.raises(ValueError, match="action_heads, an action_box or both"):
        EnvSpec({"obs": ObsField((1,), "float32")})
    with pytest.raises(TypeError, match="data type 'unit8' not understood"):
        ObsField((1,), "unit8")


def test_random_actions_are_uniform_over_every_head():
    spec = EnvSpec({"obs": ObsField((1,), "float32")}, action_heads=(3, 1, 8))
    actions, log_probs = spec.random_actions(np.random.default_rng(0), 24_000)
    assert actions.dtype == np.int64 and actions.shape == (24_000, 3)
    for head, n in enumerate(spec.action_heads):
        counts = np.bincount(actions[:, head], minlength=n)
        assert len(counts) == n  # nothing drawn at or past the head's size
        np.testing.assert_allclose(counts / len(actions), 1 / n, atol=0.01)
    np.testing.assert_allclose(log_probs, -math.log(3 * 1 * 8))


def test_engine_config_lives_in_a_folder_only_this_user_can_write(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from sfbus_components.envs.doom import game as doom

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    doom.engine_config_path.cache_clear()
    mine = tmp_path / f"sfbus-vizdoom-{os.getuid()}"
    try:
        assert doom.engine_config_path() == str(mine / "vizdoom.ini")
        assert mine.stat().st_mode & 0o777 == 0o700
        # a folder others can write (planted, or a symlink to one) is not used
        for planted in ("open", "link"):
            doom.engine_config_path.cache_clear()
            mine.rmdir() if mine.is_dir() and not mine.is_symlink() else mine.unlink()
            if planted == "open":
                mine.mkdir(mode=0o777)
                mine.chmod(0o777)
            else:
                (tmp_path / "elsewhere").mkdir(mode=0o700, exist_ok=True)
                mine.symlink_to(tmp_path / "elsewhere")
            path = doom.engine_config_path()
            assert os.path.dirname(path) not in (str(mine), str(tmp_path / "elsewhere"))
            assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    finally:
        doom.engine_config_path.cache_clear()


def test_doom_env_makes_the_engine_folder_before_its_engine_starts(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine makes ./_vizdoom as it starts, and of engines started at once in a fresh
    folder the one that lost the race died ("Failed to create ./_vizdoom/ directory: File
    exists"): the env makes it first."""
    monkeypatch.chdir(tmp_path)
    found_at_init: list[bool] = []

    class Game(vzd.DoomGame):
        def init(self) -> bool:
            found_at_init.append((tmp_path / "_vizdoom").is_dir())
            return super().init()

    monkeypatch.setattr(vzd, "DoomGame", Game)
    make_env("doom_basic").close()
    assert found_at_init == [True]
