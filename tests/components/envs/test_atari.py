"""Atari envs against the raw ALE emulator (max-pool, stack order, episodic life, clipping) and
against gymnasium's preprocessing wrappers, which they replace on the hot path."""

from __future__ import annotations

import cv2
import gymnasium as gym
import numpy as np
import pytest
from ale_py.env import AtariEnv as RawAle
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

from sfbus_components.envs import UnknownEnvError, env_spec, known_envs, make_env
from sfbus_components.envs.atari.game import AtariEnv, _GameLives, atari_games

SEED = 3
FIRE = 1


def raw_breakout() -> RawAle:
    """The bare emulator our env wraps: one frame per step, greyscale, no sticky actions."""
    env = RawAle("breakout", obs_type="grayscale", frameskip=1, repeat_action_probability=0.0)
    env.reset(seed=SEED)
    return env


def plain_breakout(**kwargs: object) -> AtariEnv:
    """Breakout preprocessed but with no random no-ops, FIRE or episodic life to line up with
    the raw emulator step for step."""
    return make_env("atari_breakout", seed=SEED, noop_max=0, fire_reset=False,
                    episodic_life=False, **kwargs)


def expected_frame(last_two: list[np.ndarray]) -> np.ndarray:
    """The max of the last two raw frames of a step, resized to 84x84 (INTER_AREA)."""
    return cv2.resize(np.maximum(*last_two), (84, 84), interpolation=cv2.INTER_AREA)


def test_names_follow_sample_factory() -> None:
    names = known_envs()
    for name in ("atari_breakout", "atari_pong", "atari_spaceinvaders", "atari_mspacman"):
        assert name in names
    games = atari_games()
    assert games["montezuma"] == "montezuma_revenge" and games["kongfumaster"] == "kung_fu_master"
    assert games["space_invaders"] == games["spaceinvaders"] == "space_invaders"
    spec = env_spec("atari_pong")
    assert spec.observation_space["obs"].shape == (4, 84, 84)
    assert spec.observation_space["obs"].dtype == "uint8"
    assert spec.action_heads == (6,) and spec.frameskip == 4


def test_unknown_game_names_close_ones() -> None:
    with pytest.raises(UnknownEnvError, match=r"unknown env 'atari_breakot'.*'atari_breakout'"):
        make_env("atari_breakot")


def test_a_missing_rom_is_an_unknown_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from ale_py import roms

    found = roms.get_rom_path
    monkeypatch.setattr(roms, "get_rom_path", lambda rom: None if rom == "pong" else found(rom))
    atari_games.cache_clear()
    try:
        with pytest.raises(UnknownEnvError, match="unknown env 'atari_pong'"):
            make_env("atari_pong")
        assert "atari_pong" not in known_envs() and "atari_breakout" in known_envs()
    finally:
        atari_games.cache_clear()


def test_frames_are_the_max_of_the_last_two_and_stacked_oldest_first() -> None:
    raw, env = raw_breakout(), plain_breakout()
    obs = env.spec.empty_obs()
    env.reset_into(obs)
    first = cv2.resize(raw.ale.getScreenGrayscale(), (84, 84), interpolation=cv2.INTER_AREA)
    assert all(np.array_equal(obs["obs"][0, c], first) for c in range(4))  # padded with frame 0

    rng = np.random.default_rng(0)
    frames, pooled_differs = [first], False
    for _ in range(40):
        action = int(rng.integers(4))
        screens = []
        for _ in range(4):  # frameskip 4 on the raw emulator: keep the last two screens
            raw.step(action)
            screens.append(raw.ale.getScreenGrayscale())
        env.step_into(np.array([[action]]), obs)
        frames.append(expected_frame(screens[-2:]))
        pooled_differs |= not np.array_equal(frames[-1], expected_frame([screens[-1]] * 2))
        want = ([frames[0]] * 4 + frames)[-4:]  # oldest first, the newest last
        for c in range(4):
            np.testing.assert_array_equal(obs["obs"][0, c], want[c])
    assert pooled_differs, "no step where the max of two frames differs from the last frame"
    env.close()
    raw.close()


def test_episodic_life_ends_episodes_per_life_and_reports_the_whole_game() -> None:
    # Space Invaders: 3 lives, and random play scores 5 to 30 a hit (Breakout's lowest bricks
    # give 1, which clipping leaves alone). Two envs on the same seed and actions: clipping
    # changes only what the agent is given.
    clipped = make_env("atari_spaceinvaders", seed=SEED)
    raw = make_env("atari_spaceinvaders", seed=SEED, clip_reward=False)
    obs_a, obs_b = clipped.spec.empty_obs(), raw.spec.empty_obs()
    clipped.reset_into(obs_a)
    raw.reset_into(obs_b)
    lives = clipped.ale.lives()
    assert lives == 3
    rng = np.random.default_rng(1)
    rewards_seen, raw_rewards, ends, steps = [], [], 0, 0
    while True:
        frame = clipped.ale.getEpisodeFrameNumber()
        action = np.array([[rng.integers(6)]])
        r_a, term, trunc, (info,) = clipped.step_into(action, obs_a)
        r_b, term_b, _, (info_b,) = raw.step_into(action, obs_b)
        np.testing.assert_array_equal(obs_a["obs"], obs_b["obs"])
        assert term[0] == term_b[0] and not trunc[0]
        assert r_a[0] == np.sign(r_b[0])
        rewards_seen.append(r_a[0])
        raw_rewards.append(r_b[0])
        steps += 1
        if not term[0]:
            assert info == {}
            continue
        ends += 1
        if "episode_return" not in info:  # a life lost: a training episode ends, the game goes on
            lives -= 1
            assert clipped.ale.lives() == lives
            assert clipped.ale.getEpisodeFrameNumber() > frame  # not reset
            # the next life starts from one frame in every channel of the stack
            assert all(np.array_equal(obs_a["obs"][0, c], obs_a["obs"][0, 3]) for c in range(3))
            continue
        assert ends == 3 and lives == 1  # one training episode per life
        assert info["episode_length"] == steps and info["episode_frames"] == 4 * steps
        assert info["episode_return"] == sum(rewards_seen)
        assert info["episode_true_return"] == sum(raw_rewards) == info_b["episode_return"]
        assert max(raw_rewards) > 1 and sum(raw_rewards) > sum(rewards_seen) > 0
        break
    assert clipped.ale.lives() == 3  # the new game
    clipped.close()
    raw.close()


def test_without_episodic_life_only_the_game_ends() -> None:
    env = make_env("atari_breakout", seed=SEED, episodic_life=False)
    obs = env.spec.empty_obs()
    env.reset_into(obs)
    rng = np.random.default_rng(2)
    for _ in range(5000):
        _, term, _, (info,) = env.step_into(np.array([[rng.integers(4)]]), obs)
        if term[0]:
            assert "episode_true_return" in info
            break
    else:
        pytest.fail("no game over in 5000 steps")
    env.close()


@pytest.mark.parametrize("sticky", [None, 0.25])
def test_sticky_actions_reach_ale(sticky: float | None) -> None:
    kwargs = {} if sticky is None else {"repeat_action_probability": sticky}
    env = make_env("atari_pong", **kwargs)
    assert env.ale.getFloat("repeat_action_probability") == pytest.approx(sticky or 0.0)
    env.close()


def test_fire_only_where_the_game_has_it() -> None:
    assert make_env("atari_breakout").game_lives.fire
    assert not make_env("atari_breakout", fire_reset=False).game_lives.fire
    assert make_env("atari_pong").game_lives.fire  # Pong's minimal set: NOOP, FIRE, ...
    assert not make_env("atari_freeway").game_lives.fire  # NOOP, UP, DOWN


@pytest.mark.parametrize("bad", [{"framestack": 0}, {"repeat_action_probability": 1.5}])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_env("atari_pong", **bad)


def gymnasium_chain(game: str, sticky: float, max_frames: int) -> gym.Env:
    """The reference preprocessing: gymnasium's AtariPreprocessing and FrameStackObservation
    around the same emulator and our `_GameLives`, as sfbus ran Atari before its own `_Frames`."""
    raw = RawAle(game, obs_type="grayscale", frameskip=1, repeat_action_probability=sticky,
                 full_action_space=False, max_num_frames_per_episode=max_frames)
    frames = AtariPreprocessing(raw, noop_max=30, frame_skip=4, screen_size=84,
                                grayscale_obs=True)
    return FrameStackObservation(_GameLives(frames, episodic_life=True, fire=True), 4)


@pytest.mark.parametrize(("game", "sticky", "max_frames"),
                         [("breakout", 0.25, 400), ("space_invaders", 0.0, 108_000)])
def test_frames_equal_gymnasiums_preprocessing_step_for_step(game: str, sticky: float,
                                                             max_frames: int) -> None:
    # No-ops drawn on reset, sticky actions, lives, game overs and truncation: the same
    # observations, rewards and ends as gymnasium's wrappers on the same seed and actions
    env = make_env(f"atari_{game.replace('_', '')}", seed=SEED, clip_reward=False,
                   repeat_action_probability=sticky, max_frames_per_episode=max_frames)
    reference = gymnasium_chain(game, sticky, max_frames)
    obs = env.spec.empty_obs()
    env.reset_into(obs)
    want, _ = reference.reset(seed=SEED)
    np.testing.assert_array_equal(obs["obs"][0], want)
    rng = np.random.default_rng(4)
    ends = {"life": 0, "game": 0, "truncated": 0}
    for _ in range(700):  # Space Invaders' first game over: step 504
        action = int(rng.integers(env.spec.action_heads[0]))
        reward, terminated, truncated, (report,) = env.step_into(np.array([[action]]), obs)
        want, want_reward, want_terminated, want_truncated, info = reference.step(action)
        assert (reward[0], terminated[0], truncated[0]) == (
            want_reward, want_terminated, want_truncated)
        if want_terminated or want_truncated:
            ends["truncated" if want_truncated else "game" if info.get("game_over")
                 else "life"] += 1
            assert ("episode_true_return" in report) == bool(info.get("game_over"))
            want, _ = reference.reset()
        np.testing.assert_array_equal(obs["obs"][0], want)
    assert ends["life"] > 0 and ends["game" if game == "space_invaders" else "truncated"] > 0, ends
    env.close()
    reference.close()
