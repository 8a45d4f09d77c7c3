"""Sample Factory's own VizDoom scenarios on the real engine: heads, measurements, shaping per
step, bots, where the files come from, and a scenario of one's own by path."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import vizdoom as vzd

from sfbus_components.envs import ObsField, UnknownEnvError, env_spec, make_env
from sfbus_components.envs.doom import scenarios

V = vzd.GameVariable
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("name", "heads", "measurements"), [
    ("doom_battle", (3, 3, 2, 2, 11), 23),  # move, strafe, attack, sprint, turn -10..10
    ("doom_battle2", (3, 3, 2, 2, 11), 23),
    ("doom_benchmark", (9,), None),  # battle.cfg's 8 buttons as one head
    ("doom_two_colors_easy", (3, 3), None),  # turn, move
    ("doom_two_colors_hard", (3, 3), None),
    ("doom_deathmatch_bots", (3, 3, 8, 2, 2, 21), 23),  # + weapon 1-7, turn -12.5..12.5
    ("doom_duel_bots", (3, 3, 8, 2, 2, 2, 21), 23),  # + use
])
def test_heads_and_inputs_are_sample_factorys(name, heads, measurements):
    spec = env_spec(name)
    assert spec.action_heads == heads
    assert spec.observation_space["obs"] == ObsField((3, 72, 128), "uint8")
    assert spec.observation_space.get("measurements") == (
        None if measurements is None else ObsField((measurements,), "float32"))
    assert spec.reward_scale == 1.0


def step(env, action: list[int], obs) -> tuple[float, bool]:
    reward, term, trunc, _ = env.step_into(np.array([action]), obs)
    return float(reward[0]), bool(term[0] or trunc[0])


def test_battle_heads_press_the_buttons_they_name():
    with make_env("doom_battle", seed=1) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        game = env.game
        idle = [0, 0, 0, 0, 5]  # the turning head's middle index turns by 0
        step(env, idle, obs)

        def turned(index: int) -> float:
            before = game.get_game_variable(V.ANGLE)
            step(env, [0, 0, 0, 0, index], obs)
            return (game.get_game_variable(V.ANGLE) - before + 180) % 360 - 180

        assert turned(5) == 0
        assert turned(0) == pytest.approx(40, abs=0.1)  # -10 per tic: left, the angle rises
        assert turned(10) == pytest.approx(-40, abs=0.1)
        assert turned(3) == pytest.approx(16, abs=0.1)  # -4 per tic

        ammo = game.get_game_variable(V.SELECTED_WEAPON_AMMO)
        for _ in range(8):
            step(env, [0, 0, 1, 0, 5], obs)  # attack
        assert game.get_game_variable(V.SELECTED_WEAPON_AMMO) < ammo
        x, y = game.get_game_variable(V.POSITION_X), game.get_game_variable(V.POSITION_Y)
        for _ in range(4):
            step(env, [1, 0, 0, 0, 5], obs)  # forward
        assert (game.get_game_variable(V.POSITION_X), game.get_game_variable(V.POSITION_Y)) \
            != (x, y)


def test_bots_weapon_head_selects_the_weapon_slot():
    with make_env("doom_duel_bots", seed=2) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        for slot in (1, 2):  # fist, pistol: what a player spawns with
            for _ in range(10):  # lowering one weapon and raising another takes some tics
                step(env, [0, 0, slot, 0, 0, 0, 10], obs)
            assert env.game.get_game_variable(V.SELECTED_WEAPON) == slot


def sf_measurements(game: vzd.DoomGame, reported: set) -> np.ndarray:
    """Sample Factory's DoomAdditionalInput, from the game's own variables; what the cfg does
    not report reads as Sample Factory's default."""
    def var(v, default=0.0):
        return game.get_game_variable(v) if v in reported else default

    ammo = [min(max(0.0, var(getattr(V, f"AMMO{i}"))) / 15, 5) for i in range(8)]
    return np.array([
        round(max(0.0, var(V.SELECTED_WEAPON))),
        min(max(0.0, var(V.SELECTED_WEAPON_AMMO)) / 15, 5),
        max(0.0, var(V.HEALTH)) / 30, var(V.ARMOR) / 30, var(V.USER2) / 10,
        var(V.ATTACK_READY), var(V.PLAYER_COUNT, 1.0) / 5,
        *[max(0.0, var(getattr(V, f"WEAPON{i}"))) for i in range(8)], *ammo], np.float32)


@pytest.mark.parametrize(("name", "cfg"), [
    ("doom_battle", "battle_continuous_turning.cfg"),
    ("doom_deathmatch_bots", "dwango5_dm_continuous_weap.cfg"),
])
def test_measurements_are_the_games_own_state(name, cfg):
    probe = vzd.DoomGame()
    probe.load_config(str(scenarios.sample_factory_folder() / cfg))
    reported = set(probe.get_available_game_variables())
    with make_env(name, seed=3) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        rng = np.random.default_rng(3)
        seen = set()
        for _ in range(150):
            actions, _ = env.spec.random_actions(rng, 1)
            _, done = step(env, actions[0].tolist(), obs)
            if done:
                continue
            expected = sf_measurements(env.game, reported)
            np.testing.assert_allclose(obs["measurements"][0], expected, rtol=1e-6)
            seen.add(tuple(expected[:3]))
        assert len(seen) > 1  # weapon, ammo or health changed: the figures follow the game
    if name == "doom_battle":  # its cfg reports no ATTACK_READY: Sample Factory sees 0 there
        assert V.ATTACK_READY not in reported and obs["measurements"][0][5] == 0


def test_battle_shaping_per_step_is_sample_factorys():
    """Kills are the game's reward; each step adds 0.005 per health point gained, -0.003 per
    point lost and 0.002 while a loaded weapon has stayed selected for 5 steps; the first step of
    an episode only sets the baseline and its last step is not shaped."""
    with make_env("doom_battle", seed=4) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        game = env.game
        rng = np.random.default_rng(4)
        health = weapon = None
        same, kills, shaped, episodes = 0, 0.0, 0, 0
        while episodes < 2:
            actions, _ = env.spec.random_actions(rng, 1)
            actions[0, 2] = rng.random() < 0.5  # attack often: kills and spent ammo
            reward, done = step(env, actions[0].tolist(), obs)
            if done:
                health = weapon = None
                same, episodes = 0, episodes + 1
                continue
            raw = game.get_last_reward()
            kills += raw
            now = max(0.0, game.get_game_variable(V.HEALTH))
            selected = max(0.0, game.get_game_variable(V.SELECTED_WEAPON))
            same = same + 1 if selected == weapon else 1
            weapon = selected
            expected = raw
            if health is not None:
                expected += 0.005 * max(0.0, now - health) - 0.003 * max(0.0, health - now)
                ready = same >= 5 and game.get_game_variable(V.SELECTED_WEAPON_AMMO) > 0
                expected += 0.002 * ready
                shaped += expected != raw
            health = now
            assert reward == pytest.approx(expected, abs=1e-6)
        assert kills > 0 and shaped > 100  # both terms were exercised


@pytest.mark.parametrize(("name", "players"), [("doom_deathmatch_bots", 8),
                                                ("doom_duel_bots", 2)])
def test_bots_are_present_and_frags_are_the_true_objective(name, players):
    """An agent that keeps attacking plays one four-minute match: the bots join and fight, its
    frags pay +1 each, its deaths -0.75, and the episode reports its frags as the score."""
    with make_env(name, seed=0) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        game = env.game
        heads = env.spec.action_heads
        rng = np.random.default_rng(0)
        frags = deaths = bot_frags = 0.0
        death_rewards: list[float] = []
        for t in range(3000):
            actions, _ = env.spec.random_actions(rng, 1)
            action = actions[0].tolist()
            action[0] = 1 if t % 40 < 30 else 2  # run forward mostly
            action[2] = 0  # keep the weapon
            action[len(heads) - 4 if len(heads) == 7 else 3] = 1  # attack
            reward, term, trunc, infos = env.step_into(np.array([action]), obs)
            if term[0] or trunc[0]:
                break
            assert game.get_game_variable(V.PLAYER_COUNT) == players
            now_frags = game.get_game_variable(V.FRAGCOUNT)
            now_deaths = game.get_game_variable(V.DEATHCOUNT)
            if now_frags > frags:
                assert reward[0] > 0.9
            if now_deaths > deaths and now_frags == frags and t > 0:
                death_rewards.append(reward[0])  # -0.75, plus the step's damage, hits, health
            frags, deaths = now_frags, now_deaths
            bot_frags = max(bot_frags, sum(
                game.get_game_variable(getattr(V, f"PLAYER{i}_FRAGCOUNT"))
                for i in range(1, players + 1)) - now_frags)
        else:
            pytest.fail("the match never ended")
        assert trunc[0] and infos[0]["episode_length"] == 4 * 60 * 35 // 4  # four minutes
        assert infos[0]["episode_frags"] == infos[0]["episode_true_return"] == frags
        assert death_rewards and np.median(death_rewards) < -0.5
        if name == "doom_deathmatch_bots":
            assert frags > 0 and bot_frags > 0  # the agent and the bots both scored


def test_missing_sample_factory_files_are_named_with_how_to_get_them(monkeypatch, tmp_path):
    package = scenarios.sample_factory_folder()
    monkeypatch.setattr(scenarios, "sample_factory_folder", lambda: None)
    with pytest.raises(ValueError, match=r"no sample-factory package is installed.*"
                                         r"pip install --no-deps sample-factory==2\.1\.1"):
        make_env("doom_benchmark")
    with pytest.raises(ValueError, match=r"scenarios_dir names .* holds no battle\.cfg"):
        make_env("doom_benchmark", scenarios_dir=str(tmp_path))
    shutil.copy(package / "battle.cfg", tmp_path)
    with pytest.raises(ValueError, match=r"names doom_scenario_path battle\.wad, which is not"):
        make_env("doom_benchmark", scenarios_dir=str(tmp_path))
    # a folder of the user's own that holds them: the scenario plays from there
    shutil.copy(package / "battle.wad", tmp_path)
    with make_env("doom_benchmark", scenarios_dir=str(tmp_path), seed=0) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        assert env.spec.action_heads == (9,)


def test_a_missing_file_is_one_located_error_at_validation(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "validate", str(ROOT / "topologies" / "doom_battle.yaml"),
         "--set", f"env_kwargs.scenarios_dir={tmp_path}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and ".yaml:" in line
    assert "battle_continuous_turning.cfg" in line and "pip install --no-deps" in line


def test_a_scenario_of_ones_own_by_path(tmp_path):
    """`doom:PATH.cfg` with its .wad beside it trains as a built-in scenario does; a .wad the
    cfg names but that is missing is named."""
    for f in ("basic.cfg", "basic.wad"):
        shutil.copy(Path(vzd.scenarios_path) / f, tmp_path / f)
    name = f"doom:{tmp_path / 'basic.cfg'}"
    assert env_spec(name).action_heads == env_spec("doom_basic", action_space="simple").action_heads
    with make_env(name, seed=0) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs)
        for _ in range(4):
            step(env, [3], obs)  # ATTACK alone
        assert env.game.get_game_variable(V.AMMO2) < 50
    (tmp_path / "basic.wad").unlink()
    with pytest.raises(ValueError, match=r"names doom_scenario_path basic\.wad, which is not in"):
        make_env(name)
    with pytest.raises(UnknownEnvError, match=r"name a VizDoom \.cfg file"):
        make_env(f"doom:{tmp_path}")
