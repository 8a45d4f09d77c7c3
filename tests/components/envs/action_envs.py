"""Small gymnasium envs of the action-space tests, importable by a run's processes
(``env=tests.components.envs.action_envs:<factory>``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pettingzoo
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


class Leavers(pettingzoo.ParallelEnv):
    """Two agents see a target action (one-hot of 2) and earn +1 for choosing it; ``runner_1``
    leaves after ``length // 2`` steps, ``runner_0`` after ``length`` (a PettingZoo parallel
    env: the adapter keeps the leaver's row, inactive, until the episode ends)."""

    metadata = {"name": "leavers"}

    def __init__(self, length: int = 8) -> None:
        self.possible_agents = ["runner_0", "runner_1"]
        self.agents: list[str] = []
        self.length = length
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent: str) -> spaces.Space:
        """A one-hot target."""
        return spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        """Two actions."""
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        """Both agents in, a target each."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        """+1 for the target; runner_1 leaves halfway."""
        rewards = {a: float(actions[a] == self.targets[a]) for a in self.agents}
        self.t += 1
        ends = {"runner_0": self.length, "runner_1": self.length // 2}
        terms = {a: self.t >= ends[a] for a in self.agents}
        obs = self._obs()
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not terms[a]]
        return obs, rewards, terms, dict.fromkeys(terms, False), infos

    def _obs(self) -> dict:
        self.targets = {a: int(self.rng.integers(2)) for a in self.agents}
        return {a: np.eye(2, dtype=np.float32)[self.targets[a]] for a in self.agents}
