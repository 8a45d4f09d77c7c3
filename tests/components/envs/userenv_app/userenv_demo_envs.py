"""A user's own envs, as a user would write them: this folder is not a package and not on the
import path; `sfbus` finds this module only because a run starts in this folder (its working
directory). The broken ones are refused at validation by tests/components/envs/test_user_env.py."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sfbus_components.envs import EnvSpec, MultiAgentEnv, ObsField
from sfbus_components.envs.multi_agent import ToyMultiAgentEnv


class GuessEnv(gym.Env):
    """Guess the hot index of a one-hot vector: +1 when right; episodes of `length` steps."""

    def __init__(self, size: int = 4, length: int = 8) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (size,), np.float32)
        self.action_space = spaces.Discrete(size)
        self.size, self.length = size, length
        self.target, self.t = 0, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        reward = float(int(action) == self.target)
        self.t += 1
        return self._observe(), reward, False, self.t >= self.length, {}

    def _observe(self) -> np.ndarray:
        self.target = int(self.np_random.integers(self.size))
        return np.eye(self.size, dtype=np.float32)[self.target]


def make_guess(length: int = 8) -> gym.Env:
    """A factory returning a plain gymnasium env."""
    return GuessEnv(length=length)


def make_toy(num_agents: int = 2) -> MultiAgentEnv:
    """A factory returning an sfbus MultiAgentEnv (two agents)."""
    return ToyMultiAgentEnv(num_agents=num_agents)


class _Float64Guess(GuessEnv):
    def _observe(self) -> np.ndarray:  # the classic slip: np.eye's default dtype
        return super()._observe().astype(np.float64)


class _ShortGuess(GuessEnv):
    def _observe(self) -> np.ndarray:
        return super()._observe()[:3]


class _DictGuess(GuessEnv):
    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict({"obs": spaces.Box(0.0, 1.0, (4,), np.float32)})


class _TextActions(GuessEnv):
    def __init__(self) -> None:
        super().__init__()
        self.action_space = spaces.Text(5)


class _WrongWrites(MultiAgentEnv):
    """Declares a (4,) field but writes 3 values into it."""

    spec = EnvSpec({"obs": ObsField((4,), "float32")}, action_heads=(2,))

    def reset_into(self, obs_out: Any, seed: int | None = None) -> None:
        obs_out["obs"][0] = np.zeros(3, np.float32)

    def step_into(self, actions: Any, obs_out: Any) -> Any:
        raise AssertionError("never reached: reset_into failed")

    def close(self) -> None:
        pass


def make_float64() -> gym.Env:
    """Declares float32, returns float64."""
    return _Float64Guess()


def make_short() -> gym.Env:
    """Declares shape (4,), returns (3,)."""
    return _ShortGuess()


def make_dict_declared() -> gym.Env:
    """Declares a Dict observation, returns a bare array."""
    return _DictGuess()


def make_text_actions() -> gym.Env:
    """An action space the adapter cannot take."""
    return _TextActions()


def make_wrong_writes() -> MultiAgentEnv:
    """A MultiAgentEnv that writes the wrong shape."""
    return _WrongWrites()


def make_broken() -> gym.Env:
    """A factory that raises."""
    raise RuntimeError("the simulator licence is missing")


def make_not_an_env() -> object:
    """A factory returning something else."""
    return {"obs": 1}
