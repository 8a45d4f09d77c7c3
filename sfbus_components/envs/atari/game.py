"""Atari 2600 games through ale-py as one-agent `MultiAgentEnv`s, preprocessed as in the literature.

Names are Sample Factory's: `atari_<game>` with the ROM's name run together (`atari_breakout`,
`atari_spaceinvaders`, `atari_montezuma`); ale-py's own ids (`atari_space_invaders`) work too.
The chain, innermost first (Mnih et al. 2015, Machado et al. 2018, as Sample Factory and CleanRL):

1. ale-py's `AtariEnv` at one frame per step, minimal action set, sticky actions
   (`repeat_action_probability`), at most `max_frames_per_episode` frames a game;
2. `_Frames`: up to `noop_max` no-ops on reset, the action repeated `frameskip` times with the
   last two frames max-pooled, greyscale, 84x84 (INTER_AREA): gymnasium's `AtariPreprocessing`
   frame for frame (a test holds them equal), stepping the emulator itself instead of through
   ale-py's env, which reads a screen after every frame only to drop three of four (1.04 ms a
   Breakout step through gymnasium's chain, 0.5 ms of it the emulator's own);
3. `_GameLives`: a training episode ends at every life lost, the game is reset only when it is
   over, FIRE is pressed to start a life where the game has that button, and the game's raw
   score is summed over all its lives;
4. the last `framestack` frames as channels, oldest first, refilled with the first frame of each
   life (gymnasium's `FrameStackObservation`, in place).

Rewards the agent trains on are clipped to their sign (`clip_reward`); the episode the runner
reports is the whole game: `episode_return` sums the rewards trained on, `episode_true_return` is
the game's raw score (what papers report), the same info key as VizDoom's unshaped score.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import cv2
import gymnasium as gym
import numpy as np

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


class _Frames(gym.Wrapper):
    """ale-py's env at one frame a step turned into agent steps of ``frameskip`` frames, each
    observed as the max of its last two greyscale screens resized to ``size`` x ``size``."""

    def __init__(self, env: gym.Env, noop_max: int, frameskip: int, size: int) -> None:
        super().__init__(env)
        if noop_max > 0 and env.unwrapped.get_action_meanings()[0] != "NOOP":
            raise ValueError("noop_max > 0 needs a game whose action 0 is NOOP")
        self.noop_max = noop_max
        self.frameskip = frameskip
        self.size = size
        self.ale = env.unwrapped.ale
        self.actions = self.ale.getMinimalActionSet()  # the env is built with the minimal set
        height, width = env.observation_space.shape[:2]
        self.screens = np.zeros((2, height, width), np.uint8)
        """The step's last screen (0) and the one before it (1)."""
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """A new game, then 1 to ``noop_max`` no-ops drawn from the emulator env's generator."""
        _, info = self.env.reset(seed=seed, options=options)
        noops = int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1)) \
            if self.noop_max > 0 else 0
        for _ in range(noops):
            _, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                _, info = self.env.reset(seed=seed, options=options)
        self.ale.getScreenGrayscale(self.screens[0])
        self.screens[1].fill(0)
        return self._observation(), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """``frameskip`` frames of ``action``; the frames after a game's end are not played."""
        ale, code, last = self.ale, self.actions[action], self.frameskip - 1
        reward, terminated, truncated = 0.0, False, False
        for frame in range(self.frameskip):
            reward += ale.act(code)
            terminated, truncated = ale.game_over(with_truncation=False), ale.game_truncated()
            if terminated or truncated:
                break  # the screens keep the last step's, as gymnasium's wrapper does
            if frame >= last - 1:
                ale.getScreenGrayscale(self.screens[last - frame])
        return self._observation(), reward, terminated, truncated, {}

    def _observation(self) -> np.ndarray:
        pooled = np.maximum(self.screens[0], self.screens[1], out=self.screens[0])
        return cv2.resize(pooled, (self.size, self.size), interpolation=cv2.INTER_AREA)


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
        fire = fire_reset and ale.get_action_meanings()[_FIRE:_FIRE + 1] == ["FIRE"]
        self.game_lives = _GameLives(_Frames(ale, noop_max, frameskip, screen_size),
                                     episodic_life, fire)
        self.stack = np.zeros((framestack, screen_size, screen_size), np.uint8)
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
        self._new_life(obs_out, seed)
        self._stats.clear()

    def _new_life(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Reset (a life, or a game when it is over) and fill the stack with its first frame."""
        obs, _ = self.game_lives.reset(seed=seed)
        self.stack[:] = obs
        np.copyto(obs_out["obs"][0], self.stack)

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step with `actions[0]`; a life lost starts the next life, a game over a new game."""
        obs, raw, terminated, truncated, info = self.game_lives.step(int(actions[0, 0]))
        reward = float(np.sign(raw)) if self._clip else float(raw)
        self._stats.add(reward)
        report: dict[str, Any] = {}
        if terminated or truncated:
            if info.get("game_over"):
                self._stats.finish(0, report)
                report["episode_true_return"] = info["game_score"]
            self._new_life(obs_out)
        else:
            self.stack[:-1] = self.stack[1:]  # numpy copies overlapping views as if buffered
            self.stack[-1] = obs
            np.copyto(obs_out["obs"][0], self.stack)
        return (np.array([reward], np.float32), np.array([bool(terminated)]),
                np.array([bool(truncated)]), [report])

    def close(self) -> None:
        """Close the emulator; safe to call twice."""
        self.game_lives.close()


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
