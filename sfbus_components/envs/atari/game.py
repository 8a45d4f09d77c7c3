"""Atari 2600 games through ale-py as one-agent `MultiAgentEnv`s, preprocessed as in the literature.

Names are Sample Factory's: `atari_<game>` with the ROM's name run together (`atari_breakout`,
`atari_spaceinvaders`, `atari_montezuma`); ale-py's own ids (`atari_space_invaders`) work too.
The chain, innermost first (Mnih et al. 2015, Machado et al. 2018, as Sample Factory and CleanRL):

1. ale-py's `AtariEnv` at one frame per step, minimal action set, sticky actions
   (`repeat_action_probability`), at most `max_frames_per_episode` frames a game;
2. gymnasium's `AtariPreprocessing`: up to `noop_max` no-ops on reset, the action repeated
   `frameskip` times with the last two frames max-pooled, greyscale, 84x84 (INTER_AREA);
3. `_GameLives` (ours): a training episode ends at every life lost, the game is reset only when
   it is over, FIRE is pressed to start a life where the game has that button, and the game's raw
   score is summed over all its lives;
4. gymnasium's `FrameStackObservation`: the last `framestack` frames as channels, oldest first,
   refilled with the first frame of each life.

Rewards the agent trains on are clipped to their sign (`clip_reward`); the episode the runner
reports is the whole game: `episode_return` sums the rewards trained on, `episode_true_return` is
the game's raw score (what papers report), the same info key as VizDoom's unshaped score.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

from sfbus_components.envs.family import unknown_env
from sfbus_components.envs.spec import (
    EnvSpec,
    EpisodeStats,
    MultiAgentEnv,
    ObsDict,
    ObsField,
    StepOutput,
)

# Sample Factory's names that are not the ROM id with its underscores removed.
_ALIASES = {"montezuma": "montezuma_revenge", "asteroid": "asteroids",
            "kongfumaster": "kung_fu_master"}
_FIRE = 1  # ALE's minimal action sets put FIRE, where a game has it, at index 1


@functools.cache
def atari_games() -> dict[str, str]:
    """Game name accepted after `atari_` -> ale-py ROM id, for every ROM installed (cached)."""
    import ale_py
    from ale_py import roms

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner from every worker
    games: dict[str, str] = {}
    for rom in roms.get_all_rom_ids():
        if roms.get_rom_path(rom) is not None:
            games[rom.replace("_", "")] = rom
            games[rom] = rom
    games.update({alias: rom for alias, rom in _ALIASES.items() if rom in games})
    return games


def atari_names() -> list[str]:
    """The `atari_<game>` env names, one per installed ROM, sorted."""
    return sorted(f"atari_{rom.replace('_', '')}" for rom in set(atari_games().values()))


class _GameLives(gym.Wrapper):
    """Ends an episode at every life lost (`episodic_life`) but resets the game only at game
    over; presses FIRE to start each life (`fire`); sums the game's raw score over its lives.

    `info["game_over"]` marks the step that ended the game, with `info["game_score"]`.
    """

    def __init__(self, env: gym.Env, episodic_life: bool, fire: bool) -> None:
        super().__init__(env)
        self.episodic_life = episodic_life
        self.fire = fire
        self.ale = env.unwrapped.ale
        self.lives = 0
        self.score = 0.0
        self.game_over = True
        self.last_obs: Any = None

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Start a new game when the last one is over (or a seed is given), else a new life."""
        info: dict[str, Any] = {}
        if self.game_over or seed is not None:
            self.last_obs, info = self.env.reset(seed=seed, options=options)
            self.score, self.game_over = 0.0, False
        if self.fire:
            # The game waits for FIRE to serve; the score counts, a loss here restarts it.
            self.last_obs, reward, term, trunc, info = self.env.step(_FIRE)
            self.score += float(reward)
            if term or trunc:
                self.game_over = True
                return self.reset()
        self.lives = self.ale.lives()
        return self.last_obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Step the game; `terminated` also on a life lost when `episodic_life`."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.last_obs = obs
        self.score += float(reward)
        lives = self.ale.lives()
        # Some games (Qbert) sit at 0 lives for a few frames before the game ends: only a
        # count still above zero is a life lost, the game's own end comes with `terminated`.
        life_lost = 0 < lives < self.lives
        self.lives = lives
        if terminated or truncated:
            self.game_over = True
            info = {**info, "game_over": True, "game_score": self.score}
        elif life_lost and self.episodic_life:
            terminated = True
        return obs, reward, terminated, truncated, info


class AtariEnv(MultiAgentEnv):
    """One Atari game (one agent), observation `obs` uint8 `(framestack, 84, 84)`; build with
    `make_atari_env`."""

    def __init__(self, game: str, *, seed: int | None = None, frameskip: int = 4,
                 framestack: int = 4, noop_max: int = 30, episodic_life: bool = True,
                 fire_reset: bool = True, clip_reward: bool = True,
                 repeat_action_probability: float = 0.0, screen_size: int = 84,
                 max_frames_per_episode: int = 108_000) -> None:
        from ale_py.env import AtariEnv as AleEnv

        if framestack < 1:
            raise ValueError(f"framestack must be >= 1, not {framestack}")
        if not 0.0 <= repeat_action_probability <= 1.0:
            raise ValueError("repeat_action_probability must be in [0, 1], not "
                             f"{repeat_action_probability}")
        rom = atari_games().get(game)
        if rom is None:
            raise ValueError(f"unknown Atari game {game!r}; known: {atari_names()}")
        self.game = rom
        # Greyscale frames from the emulator: the RGB ones would be copied every frame unused.
        ale = AleEnv(rom, obs_type="grayscale", frameskip=1,
                     repeat_action_probability=repeat_action_probability,
                     full_action_space=False, max_num_frames_per_episode=max_frames_per_episode)
        env: gym.Env = AtariPreprocessing(ale, noop_max=noop_max, frame_skip=frameskip,
                                          screen_size=screen_size, grayscale_obs=True)
        fire = fire_reset and ale.get_action_meanings()[_FIRE:_FIRE + 1] == ["FIRE"]
        self.game_lives = _GameLives(env, episodic_life, fire)
        self.env = FrameStackObservation(self.game_lives, framestack)
        self._seed = seed
        self._clip = clip_reward
        obs = ObsField((framestack, screen_size, screen_size), "uint8")
        self._spec = EnvSpec({"obs": obs}, action_heads=(int(ale.action_space.n),),
                             frameskip=frameskip)
        self._stats = EpisodeStats(1, frameskip)

    @property
    def spec(self) -> EnvSpec:
        """The env's fixed spec."""
        return self._spec

    @property
    def ale(self) -> Any:
        """The emulator (`ale_py.ALEInterface`), for inspection; do not step it directly."""
        return self.game_lives.ale

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Start a new game (the first one with the constructor's seed) into `obs_out` row 0."""
        if seed is None:
            seed, self._seed = self._seed, None
        self.game_lives.game_over = True  # a reset asked for from outside is always a new game
        obs, _ = self.env.reset(seed=seed)
        np.copyto(obs_out["obs"][0], obs)
        self._stats.clear()

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step with `actions[0]`; a life lost starts the next life, a game over a new game."""
        obs, raw, terminated, truncated, info = self.env.step(int(actions[0, 0]))
        reward = float(np.sign(raw)) if self._clip else float(raw)
        self._stats.add(reward)
        report: dict[str, Any] = {}
        if terminated or truncated:
            if info.get("game_over"):
                self._stats.finish(0, report)
                report["episode_true_return"] = info["game_score"]
            obs, _ = self.env.reset()
        np.copyto(obs_out["obs"][0], obs)
        return (np.array([reward], np.float32), np.array([bool(terminated)]),
                np.array([bool(truncated)]), [report])

    def close(self) -> None:
        """Close the emulator; safe to call twice."""
        self.env.close()


def make_atari_env(game: str, **kwargs: Any) -> AtariEnv:
    """Create Atari `game` (a name after `atari_`, see `atari_games`) with the standard
    preprocessing; kwargs are `AtariEnv`'s settings."""
    return AtariEnv(game, **kwargs)


def resolve(name: str) -> Callable[..., AtariEnv]:
    """The factory of `atari_<game>` (the registry's `atari_` family)."""
    game = name[len("atari_"):]
    if game not in atari_games():  # unknown game, or its ROM is missing from ale-py
        raise unknown_env(name, atari_names())
    return lambda **kwargs: make_atari_env(game, **kwargs)
