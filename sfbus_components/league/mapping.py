"""The league's policy mapping: a learner against the latest policies or a frozen snapshot.

Built by the rollout worker as ``LeagueMapping(num_policies, worker, seed, opponent_slots=S,
latest_ratio=r)`` (the worker adds ``opponent_slots`` from the run's settings; ``latest_ratio``
comes from ``policy_mapping_params``). At each episode start, agent 0 of a match plays a trained
policy drawn uniformly (its steps train it); every other agent plays, with probability
``latest_ratio``, a trained policy as well (plain self-play: its steps train too), else one of
the ``S`` opponent slots, policy ids ``num_policies .. num_policies + S - 1``, drawn uniformly:
each holds a snapshot the league drew from its pool with the sampler's weights
(:mod:`sfbus_components.league.opponents`), so a match meets a snapshot with the sampler's
probabilities. The opponent slots' steps are never trained on.
"""

from __future__ import annotations

import numpy as np


class LeagueMapping:
    """Agent 0 a trained policy; the others the latest policies or an opponent slot."""

    def __init__(self, num_policies: int, worker: int = 0, seed: int = 0,
                 opponent_slots: int = 0, latest_ratio: float = 0.5) -> None:
        if opponent_slots < 1:
            raise ValueError(f"a league needs opponent slots (settings.opponent_slots >= 1), "
                             f"got {opponent_slots}")
        if not 0.0 <= latest_ratio <= 1.0:
            raise ValueError(f"latest_ratio must be within [0, 1], got {latest_ratio}")
        self.num_policies = num_policies
        self.opponent_slots = opponent_slots
        self.latest_ratio = latest_ratio
        self.rng = np.random.default_rng([seed, worker, 0x1EA6])

    def assign(self, env_index: int, agent_index: int, episode: int) -> int:
        """A trained policy for agent 0; the latest or an opponent slot for the others."""
        if agent_index == 0 or self.rng.random() < self.latest_ratio:
            return int(self.rng.integers(self.num_policies))
        return self.num_policies + int(self.rng.integers(self.opponent_slots))
