"""A group of envs stepped as one vector into contiguous rows (batched sampling's rollout step).

Row ``i * num_agents + a`` of every array is agent ``a`` of the group's env ``i``: one call takes
the group's ``[rows, ...]`` actions and writes its ``[rows, ...]`` observations, rewards and
dones, each env writing its rows in place, with no per-env gather or scatter. VizDoom's
``make_action`` blocks until the engine (a process of its own) has run the tics, and its API has
no separate send and receive to overlap the engines with, so the step itself is a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from components.envs.spec import EnvError, MultiAgentEnv, ObsDict


class VectorEnvs:
    """Envs ``envs[first:first + count]`` (of ``num_agents`` agents each) as one vector."""

    def __init__(self, envs: list[MultiAgentEnv], first: int, count: int, num_agents: int,
                 on_error: Callable[[int, ObsDict, EnvError], None]) -> None:
        self.envs = envs
        """The owner's list: an env recreated after an error replaces its entry."""
        self.first = first
        self.rows = [slice(i * num_agents, (i + 1) * num_agents) for i in range(count)]
        self.on_error = on_error
        """Called with (env index, its observation rows, the error); must reset a fresh env
        into those rows."""

    def step_into(self, actions: np.ndarray, obs_out: ObsDict, rewards: np.ndarray,
                  dones: np.ndarray) -> list[tuple[int, list[dict[str, Any]]]]:
        """Step every env with its rows of ``actions``, writing its rows of ``obs_out``,
        ``rewards`` and ``dones`` (bool); returns (first row, infos) of the envs that ended an
        episode. An env that raised ``EnvError`` reads as done with reward 0 and no episode."""
        ended = []
        for i, rows in enumerate(self.rows):
            out = {k: v[rows] for k, v in obs_out.items()}
            try:
                r, terminated, truncated, infos = self.envs[self.first + i].step_into(
                    actions[rows], out)
            except EnvError as error:
                self.on_error(self.first + i, out, error)
                rewards[rows] = 0.0
                dones[rows] = True
                continue
            rewards[rows] = r
            done = np.logical_or(terminated, truncated, out=dones[rows])
            if done.any():
                ended.append((rows.start, infos))
        return ended
