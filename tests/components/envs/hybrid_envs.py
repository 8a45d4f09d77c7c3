"""A small gymnasium env with a hybrid action (a Tuple of a Box and a Discrete), importable by a
run's processes (``env=tests.components.envs.hybrid_envs:make_pick_and_set``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class PickAndSet(gym.Env):
    """Each step shows a target choice (one-hot of ``n``) and a target value ``v`` in [-1, 1];
    the action is ``(x, choice)``, a Box value and a Discrete choice (the Box first, so the
    adapter must put the tuple back in the env's order). Reward
    ``0.5 [choice right] + 0.5 max(0, 1 - |clip(x, -1, 1) - v|)``: at most 1 a step, and only a
    policy that learns both parts scores near ``length`` an episode."""

    def __init__(self, n: int = 3, length: int = 16) -> None:
        self.n, self.length = n, length
        self.observation_space = spaces.Box(-1.0, 1.0, (n + 1,), np.float32)
        self.action_space = spaces.Tuple((spaces.Box(-1.0, 1.0, (1,), np.float32),
                                          spaces.Discrete(n)))

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        """A new episode and its first targets."""
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: tuple[np.ndarray, int]) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Score ``action`` against the shown targets, then draw the next ones."""
        x, choice = action
        if np.shape(x) != (1,) or not 0 <= int(choice) < self.n:
            raise ValueError(f"bad action {action!r}")
        value = float(np.clip(np.asarray(x, np.float64)[0], -1.0, 1.0))
        reward = 0.5 * (int(choice) == self.choice) + 0.5 * max(0.0, 1.0 - abs(value - self.value))
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}

    def _obs(self) -> np.ndarray:
        self.choice = int(self.np_random.integers(self.n))
        self.value = float(self.np_random.uniform(-1.0, 1.0))
        obs = np.zeros(self.n + 1, np.float32)
        obs[self.choice] = 1.0
        obs[-1] = self.value
        return obs


def make_pick_and_set(n: int = 3, length: int = 16) -> PickAndSet:
    """The factory a topology names."""
    return PickAndSet(n, length)
