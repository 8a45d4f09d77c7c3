"""VizDoom scenarios as Sample Factory trains them: heads, reward scale, gathering shaping."""

from __future__ import annotations

import numpy as np
import pytest
import vizdoom as vzd

from sfbus_components.envs import env_spec, make_env

V = vzd.GameVariable


def test_sample_factory_action_heads_and_reward_scales():
    assert env_spec("doom_basic").action_heads == (4,)  # no-op + its 3 buttons
    assert env_spec("doom_basic").reward_scale == 0.01
    assert env_spec("doom_defend_the_center").action_heads == (3, 2)  # turn x attack
    assert env_spec("doom_defend_the_center").reward_scale == 1.0
    assert env_spec("doom_deadly_corridor").action_heads == (3, 3, 3, 2)
    assert env_spec("doom_health_gathering_supreme").action_heads == (5,)  # + MOVE_BACKWARD
    assert env_spec("doom_defend_the_center", action_space="simple").action_heads == (4,)


def test_defend_the_center_heads_press_the_buttons_they_name():
    with make_env("doom_defend_the_center", seed=1) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        game = env.game

        def changes(action: tuple[int, int]) -> tuple[float, float]:
            angle, ammo = game.get_game_variable(V.ANGLE), game.get_game_variable(V.AMMO2)
            for _ in range(3):
                env.step_into(np.array([action]), obs)
            return (game.get_game_variable(V.ANGLE) - angle) % 360, \
                ammo - game.get_game_variable(V.AMMO2)

        turned, fired = changes((0, 0))
        assert turned == 0 and fired == 0
        left, fired = changes((1, 0))
        assert 0 < left < 180 and fired == 0  # TURN_LEFT raises the angle
        right, fired = changes((2, 0))
        assert right > 180 and fired == 0  # TURN_RIGHT lowers it
        turned, fired = changes((0, 1))
        assert turned == 0 and fired > 0  # ATTACK spends ammo


@pytest.mark.parametrize("scenario", ["health_gathering", "health_gathering_supreme"])
def test_gathering_adds_one_per_health_rise_and_reports_the_game_reward(scenario):
    with make_env(f"doom_{scenario}", seed=3) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        game = env.game
        rng = np.random.default_rng(0)
        health, game_sum, bonuses, shaped_episodes = None, 0.0, 0.0, 0
        for _ in range(6000):
            action = rng.integers(0, 4)  # no-op, TURN_LEFT, TURN_RIGHT, MOVE_FORWARD
            reward, term, trunc, infos = env.step_into(np.array([[action]]), obs)
            if term[0] or trunc[0]:
                # the game's own reward is the true return; the return adds the bonuses
                assert infos[0]["episode_true_return"] == pytest.approx(
                    game_sum + float(reward[0]))
                assert infos[0]["episode_return"] == pytest.approx(
                    game_sum + bonuses + float(reward[0]))
                shaped_episodes += bonuses > 0
                if shaped_episodes == 2:
                    break
                health, game_sum, bonuses = None, 0.0, 0.0
                continue
            raw = game.get_last_reward()
            now = game.get_game_variable(V.HEALTH)
            bonus = 1.0 if health is not None and now > health else 0.0
            assert reward[0] == pytest.approx(raw + bonus)
            game_sum += raw
            bonuses += bonus
            health = now
        else:  # the shaping must have been exercised: medkits picked up in two episodes
            pytest.fail(f"{shaped_episodes} episodes with a health rise in 6000 steps")


@pytest.mark.parametrize("scenario", ["health_gathering", "health_gathering_supreme"])
def test_gathering_rewards_are_sample_factorys_cfg(scenario):
    """0.01 per tic alive and no death penalty (VizDoom's cfg: 1 and -100, which drown the +1
    shaping), and MOVE_BACKWARD among the buttons, as Sample Factory's own cfg has them."""
    with make_env(f"doom_{scenario}", seed=5) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        buttons = env.game.get_available_buttons()
        assert buttons == [vzd.Button.TURN_LEFT, vzd.Button.TURN_RIGHT, vzd.Button.MOVE_FORWARD,
                           vzd.Button.MOVE_BACKWARD]
        game_rewards = []
        for _ in range(3000):
            _, term, _, infos = env.step_into(np.array([[0]]), obs)  # idle: acid kills
            if term[0]:
                break
            game_rewards.append(env.game.get_last_reward())
        else:
            pytest.fail("standing on the acid never ended the episode")
        assert game_rewards == pytest.approx([0.04] * len(game_rewards))  # frameskip 4 x 0.01
        # the last step is alive for part of its tics and has no penalty for dying
        assert 0 <= infos[0]["episode_true_return"] - sum(game_rewards) <= 0.04 + 1e-9
