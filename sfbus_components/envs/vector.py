"""A group of envs stepped as one vector: the rollout worker's per-env loop, in every sampling mode,
and the interface of a batch that batched sampling steps with one call (:class:`EnvBatch`).

Row ``i * num_agents + a`` of the actions, rewards, dones and time-outs is agent ``a`` of the
group's env ``i``; env ``i`` writes its observation into ``outs[i]``, wherever its owner wants it:
views of a contiguous block (batched sampling, :meth:`VectorEnvs.rows_of`), a trajectory slot's
row, or a scratch array. VizDoom's ``make_action`` blocks until the engine (a process of its own)
has run the tics, and its API has no separate send and receive to overlap the engines with, so the
step itself is a loop.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np

from sfbus_components.envs.spec import EnvError, MultiAgentEnv, ObsDict

Ended = list[tuple[int, list[dict[str, Any]]]]
"""(first row, infos) of every env whose step ended in a done."""


class EnvBatch(abc.ABC):
    """Envs whose rows batched sampling steps with one call: :class:`VectorEnvs` (a loop over
    envs of their own) or an env family's native batch (EnvPool's, one call into C++)."""

    @abc.abstractmethod
    def step_rows(self, actions: np.ndarray, obs: ObsDict, rewards: np.ndarray,
                  dones: np.ndarray, time_outs: np.ndarray) -> Ended:
        """Step every env with its rows of ``actions``, writing its rows of the contiguous
        ``[rows, ...]`` observations ``obs``, ``rewards``, ``dones`` and ``time_outs``
        (truncated and not terminated); an env whose episode
        ended is already reset (its rows hold the next episode's first observation). Returns
        the envs that are done; a native batch raises ``EnvError`` when its engine broke."""


class BatchedEnv(EnvBatch):
    """A native batch: envs in one engine, made, reset and closed together (EnvPool's)."""

    @abc.abstractmethod
    def reset_into(self, obs: ObsDict) -> None:
        """Start every env's episode, writing the first observations into the rows ``obs``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the engine; safe to call twice."""


class VectorEnvs(EnvBatch):
    """Envs ``envs[first:first + count]`` (of ``num_agents`` agents each) as one vector."""

    def __init__(self, envs: list[MultiAgentEnv], first: int, count: int, num_agents: int,
                 on_error: Callable[[int, ObsDict, EnvError], None]) -> None:
        self.envs = envs
        """The owner's list: an env recreated after an error replaces its entry."""
        self.first = first
        self.count = count
        self.num_agents = num_agents
        self.rows = [slice(i * num_agents, (i + 1) * num_agents) for i in range(count)]
        self.on_error = on_error
        """Called with (env index, its observation rows, the error); must reset a fresh env
        into those rows."""
        # What a failed env's step reads as: done with reward 0, and no episode to report.
        self._failed = (np.zeros(num_agents, np.float32), np.ones(num_agents, bool),
                        np.zeros(num_agents, bool), [{} for _ in range(num_agents)])

    def rows_of(self, obs: ObsDict) -> list[ObsDict]:
        """Each env's rows of the contiguous ``[rows, ...]`` observations ``obs`` (views)."""
        return [{k: v[rows] for k, v in obs.items()} for rows in self.rows]

    def step_rows(self, actions: np.ndarray, obs: ObsDict, rewards: np.ndarray,
                  dones: np.ndarray, time_outs: np.ndarray) -> Ended:
        """:meth:`step_into` each env's rows of the contiguous observations ``obs``."""
        return self.step_into(actions, self.rows_of(obs), rewards, dones, time_outs)

    def step_into(self, actions: np.ndarray, outs: list[ObsDict], rewards: np.ndarray,
                  dones: np.ndarray, time_outs: np.ndarray) -> Ended:
        """Step every env with its rows of ``actions``, writing its observation into its entry
        of ``outs`` and its rows of ``rewards``, ``dones`` (terminated or truncated) and
        ``time_outs`` (truncated and not terminated), bools; returns the envs that are done.
        An env that raised ``EnvError`` reads as done (not a time-out) with reward 0 and empty
        infos."""
        na = self.num_agents
        ended: Ended = []
        for i, env in enumerate(self.envs[self.first:self.first + self.count]):
            a = i * na
            out = outs[i]
            try:
                r, term, trunc, infos = env.step_into(actions[a:a + na], out)
            except EnvError as error:
                self.on_error(self.first + i, out, error)
                r, term, trunc, infos = self._failed
            if na == 1:  # scalar writes beat slice writes for the common single-agent env
                rewards[a] = r[0]
                done = dones[a] = term[0] or trunc[0]
                time_outs[a] = trunc[0] and not term[0]
            else:
                rewards[a:a + na] = r
                done = np.logical_or(term, trunc, out=dones[a:a + na]).any()
                np.greater(trunc, term, out=time_outs[a:a + na])  # trunc and not term
            if done:
                ended.append((a, infos))
        return ended
