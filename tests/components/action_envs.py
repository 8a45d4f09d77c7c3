"""Small gymnasium envs of the action-space tests, importable by a run's processes
(``env=tests.components.action_envs:<factory>``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class LowestAllowed(gym.Env):
    """Each step a random non-empty half of ``n`` actions is allowed (the ``action_mask``);
    reward +1 for the lowest-index allowed action, 0 for another allowed one, -1 for a masked
    one. The observation is only the episode's progress, so a policy can do well only through
    the mask: with it, logits ordered by index score every step (``length`` per episode);
    without it, the best fixed action scores about 0."""

    def __init__(self, n: int = 6, length: int = 16) -> None:
        self.n, self.length = n, length
        self.observation_space = spaces.Dict({
            "obs": spaces.Box(0.0, 1.0, (1,), np.float32),
            "action_mask": spaces.Box(0, 1, (n,), np.int8)})
        self.action_space = spaces.Discrete(n)
        self.masked_chosen = 0
        """Masked actions the env was given (the tests read it)."""

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        """A new episode and its first mask."""
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        """Score ``action`` against the current mask, then draw the next one."""
        allowed = np.flatnonzero(self.mask)
        if not self.mask[action]:
            self.masked_chosen += 1
            reward = -1.0
        else:
            reward = 1.0 if action == allowed[0] else 0.0
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}

    def _obs(self) -> dict:
        mask = self.np_random.random(self.n) < 0.5
        mask[self.np_random.integers(self.n)] = True  # never an empty mask
        self.mask = mask.astype(np.int8)
        return {"obs": np.array([self.t / self.length], np.float32),
                "action_mask": self.mask.copy()}


def make_lowest_allowed(n: int = 6, length: int = 16) -> LowestAllowed:
    """The factory a topology names."""
    return LowestAllowed(n, length)
