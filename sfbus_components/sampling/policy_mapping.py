"""Which policy acts for each agent: the mapping chosen at episode starts, and its bookkeeping.

A rollout worker asks its mapping for a policy whenever an agent starts an episode
(``assign(env, agent, episode)``; ``env`` is the worker's env index, ``episode`` counts that
agent's episodes from 0). The mapping is a class named by import path in the rollout parameter
``policy_mapping`` and built as ``cls(num_policies, worker, seed)``; a self-play mapping can pair
an env's agents by deriving every agent's policy from ``(env, episode)``.

A trajectory slot holds T steps, so an episode that starts mid-slot may switch the agent's policy
inside it. The steps keep the id of the policy that acted (``policies[slot, t]``); the slot goes to
the policy that acted for most of its steps (ties: the one acting at the end) and that learner
masks out the other policies' steps. What is lost is the minority part of the slots where a switch
happened (under T/2 steps per switch); Sample Factory's sampler, which switches policies at
episode boundaries as well, likewise sends each trajectory to a single learner.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from sfbus import ImportPathError, import_object


class PolicyMapping(Protocol):
    """Assigns a policy to an agent at the start of each of its episodes."""

    def assign(self, env_index: int, agent_index: int, episode: int) -> int:
        """The policy agent ``agent_index`` of env ``env_index`` acts with in ``episode``."""
        ...


class RandomMapping:
    """Uniformly random policy per agent and episode (the paper's default)."""

    def __init__(self, num_policies: int, worker: int = 0, seed: int = 0) -> None:
        self.num_policies = num_policies
        self.rng = np.random.default_rng([seed, worker, 0x9B1])

    def assign(self, env_index: int, agent_index: int, episode: int) -> int:
        """A policy drawn uniformly from the population."""
        return int(self.rng.integers(self.num_policies))


class RoundRobinMapping:
    """Deterministic rotation: policy ``(worker + env + agent + episode) % num_policies``."""

    def __init__(self, num_policies: int, worker: int = 0, seed: int = 0) -> None:
        self.num_policies = num_policies
        self.worker = worker

    def assign(self, env_index: int, agent_index: int, episode: int) -> int:
        """The next policy in turn."""
        return (self.worker + env_index + agent_index + episode) % self.num_policies


def load_mapping(path: str, num_policies: int, worker: int, seed: int,
                 opponent_slots: int = 0, options: dict[str, Any] | None = None) -> PolicyMapping:
    """Build the mapping class named ``module:Class`` with keyword arguments ``options``, and
    ``opponent_slots`` when the run has some (a league's mapping, which assigns them)."""
    try:
        cls = import_object(path)
    except ImportPathError as error:
        raise ValueError(f"policy_mapping: {error}") from None
    kwargs = dict(options or {})
    if opponent_slots:
        kwargs["opponent_slots"] = opponent_slots
    try:
        mapping = cls(num_policies, worker, seed, **kwargs)
    except TypeError as error:
        raise ValueError(f"policy_mapping {path!r} with {kwargs}: {error}") from None
    if not callable(getattr(mapping, "assign", None)):
        raise TypeError(f"policy_mapping {path!r} has no assign(env, agent, episode) method")
    return mapping


def trajectory_owners(policies: np.ndarray, num_policies: int) -> np.ndarray:
    """The policy owning each trajectory of ``policies`` [rows, T]: the one with most steps,
    ties to the one acting at the last step."""
    ids = np.arange(num_policies)
    counts = (policies[:, :, None] == ids).sum(1) * 2  # [rows, P], even
    counts += policies[:, -1:] == ids  # +1 breaks a tie towards the last step's policy
    return counts.argmax(1)


class SplitGroups:
    """A split's rows grouped by policy: the request-table order and one (policy, offset, count)
    per group; rebuilt only after a policy changed in the split."""

    def __init__(self, first_row: int, policies: np.ndarray, num_policies: int) -> None:
        order = np.argsort(policies, kind="stable")
        self.rows = first_row + order
        """Worker rows in request-table order."""
        ordered = policies[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        ends = np.r_[starts[1:], len(order)]
        self.groups = [(int(ordered[a]), int(a), int(b - a))
                       for a, b in zip(starts, ends, strict=True)]
        self.counts = np.bincount(policies, minlength=num_policies)
        """Rows per policy id (frame accounting)."""


class AgentPolicies:
    """A rollout worker's per-agent policy ids with a population: assignment at episode starts,
    request groups per split, trajectory owners and env frames per policy."""

    def __init__(self, mapping: PolicyMapping, num_policies: int, num_envs: int, num_agents: int,
                 splits: int) -> None:
        self.mapping = mapping
        self.num_policies = num_policies
        self.num_agents = num_agents
        rows = num_envs * num_agents
        self.rows_per_split = rows // splits
        self.policy = np.array([self._assign(r, 0) for r in range(rows)], np.int64)
        """Policy of each agent row (row = env * num_agents + agent)."""
        self.episodes = np.zeros(rows, np.int64)
        self.ended: list[int] = []
        """Rows that finished an episode in the step being processed."""
        self.switched = [False] * splits
        """A policy changed in the split since its slots started (mixed trajectories)."""
        self.frames = np.zeros(num_policies, np.int64)
        """Env frames per policy since the last progress report."""
        self._groups: list[SplitGroups | None] = [None] * splits

    def _assign(self, row: int, episode: int) -> int:
        env, agent = divmod(row, self.num_agents)
        policy = int(self.mapping.assign(env, agent, episode))
        if not 0 <= policy < self.num_policies:
            raise ValueError(f"policy mapping returned policy {policy}; the population has "
                             f"{self.num_policies}")
        return policy

    def switch(self) -> list[int]:
        """Assign the next episode's policy to every row in ``ended``; the rows that changed."""
        changed = []
        for row in self.ended:
            self.episodes[row] += 1
            policy = self._assign(row, int(self.episodes[row]))
            if policy != self.policy[row]:
                self.policy[row] = policy
                s = row // self.rows_per_split
                self.switched[s] = True
                self._groups[s] = None
                changed.append(row)
        self.ended.clear()
        return changed

    def groups(self, s: int) -> SplitGroups:
        """Split ``s``'s rows grouped by policy (cached until one of them switches)."""
        groups = self._groups[s]
        if groups is None:
            lo = s * self.rows_per_split
            groups = self._groups[s] = SplitGroups(
                lo, self.policy[lo:lo + self.rows_per_split], self.num_policies)
        return groups

    def count_frames(self, s: int, frames_per_row: int) -> None:
        """Add one step of split ``s`` to the frames per policy."""
        self.frames += self.groups(s).counts * frames_per_row

    def take_frames(self) -> tuple[int, ...]:
        """Frames per policy since the previous call."""
        frames = tuple(self.frames.tolist())
        self.frames[:] = 0
        return frames

    def owners(self, s: int, step_policies: np.ndarray) -> list[int]:
        """The policy each of split ``s``'s finished trajectories goes to (``step_policies``:
        their ``policies[slot, :T]``); the split's next slots start unmixed."""
        lo = s * self.rows_per_split
        if not self.switched[s]:
            return self.policy[lo:lo + self.rows_per_split].tolist()
        self.switched[s] = False
        return trajectory_owners(step_policies, self.num_policies).tolist()
