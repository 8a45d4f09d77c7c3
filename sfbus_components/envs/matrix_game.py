"""A repeated two-player matrix game (rock-paper-scissors by default): the league's tiny test
game, where plain self-play is known to cycle.

Both agents pick one of ``n`` actions each round; an agent earns ``payoff[own][other]`` (the
matrix is the row player's, the same for both seats: a symmetric game). Each sees a one-hot of
its own and its opponent's previous action (zeros in the first round). A match lasts ``rounds``
rounds and ends terminated for both; its infos carry ``episode_win`` (1.0 for the higher
return, 0.5 for a draw, 0.0 for the lower) and ``episode_opponent``, as a VizDoom duel's do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sfbus_components.envs.spec import (
    EnvSpec,
    EpisodeStats,
    MultiAgentEnv,
    ObsDict,
    ObsField,
    StepOutput,
)

ROCK_PAPER_SCISSORS = ((0.0, -1.0, 1.0), (1.0, 0.0, -1.0), (-1.0, 1.0, 0.0))


class MatrixGame(MultiAgentEnv):
    """Two agents playing ``rounds`` rounds of a symmetric matrix game per match."""

    def __init__(self, payoff: tuple[tuple[float, ...], ...] = ROCK_PAPER_SCISSORS,
                 rounds: int = 8, seed: int | None = None) -> None:
        self.payoff = np.array(payoff, np.float32)
        n = len(self.payoff)
        if self.payoff.shape != (n, n) or n < 2:
            raise ValueError(f"payoff must be a square matrix of 2 or more actions, got "
                             f"shape {self.payoff.shape}")
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        self.rounds = rounds
        self._spec = EnvSpec({"obs": ObsField((2 * n,), "float32")}, action_heads=(n,),
                             num_agents=2)
        self._stats = EpisodeStats(2, 1)
        self._round = 0

    @property
    def spec(self) -> EnvSpec:
        """The game's fixed spec."""
        return self._spec

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Start a match: no previous actions to see."""
        self._round = 0
        self._stats.clear()
        obs_out["obs"][:] = 0.0

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Play one round; after the last, report the match and start the next."""
        a, b = int(actions[0, 0]), int(actions[1, 0])
        rewards = np.array([self.payoff[a, b], self.payoff[b, a]], np.float32)
        self._stats.add(rewards)
        self._round += 1
        infos: list[dict[str, Any]] = [{}, {}]
        done = self._round >= self.rounds
        if done:
            returns = self._stats.returns.copy()
            for i in range(2):
                self._stats.finish(i, infos[i])
                infos[i]["episode_win"] = float(np.sign(returns[i] - returns[1 - i]) + 1) / 2
                infos[i]["episode_opponent"] = 1 - i
            self.reset_into(obs_out)
        else:
            n = len(self.payoff)
            obs = obs_out["obs"]
            obs[:] = 0.0
            obs[0, a], obs[0, n + b] = 1.0, 1.0
            obs[1, b], obs[1, n + a] = 1.0, 1.0
        return rewards, np.full(2, done), np.zeros(2, bool), infos

    def close(self) -> None:
        """Nothing to release."""


def make_matrix_game(payoff: tuple[tuple[float, ...], ...] = ROCK_PAPER_SCISSORS,
                     rounds: int = 8, seed: int | None = None) -> MatrixGame:
    """Create the matrix game (``env: sfbus_components.envs.matrix_game:make_matrix_game``)."""
    return MatrixGame(payoff, rounds, seed)
