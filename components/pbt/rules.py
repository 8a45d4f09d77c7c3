"""Population-based training rules, free of processes and messages (the PBT actor applies them).

The paper's schedule (supplement A.3.1): every ``interval`` env frames of a policy, rank the
population by its objective. A policy in the best ``replace_fraction`` (30%) is left alone. Any
other (the bottom 70%) has each hyperparameter mutated with probability ``mutation_rate`` (15%)
by a factor of ``perturb_factor`` (1.2) up or down; a policy in the worst ``replace_fraction``
first copies the weights and hyperparameters of a policy drawn from the best, unless the source
is better by no more than ``replace_threshold`` (the paper's 0.35 win-rate gap for duels). The
counts are ``ceil(replace_fraction * n)`` of the ``n`` policies with an objective, as in Sample
Factory. Parameters in ``(0, 1)`` that live close to 1 (Adam's betas, the discount) are mutated
through ``1 - x`` so they stay below 1.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

COMPLEMENT_SUFFIXES = ("adam_beta1", "adam_beta2", "gamma")
"""Hyperparameters mutated as ``1 - x``."""


@dataclass(frozen=True)
class PbtRules:
    """The numbers of the PBT schedule."""

    interval: int = 5_000_000
    """Env frames of a policy between two of its updates."""
    start_delay: int = 0
    """Env frames a policy trains before its first update (mutation or exchange)."""
    mutation_rate: float = 0.15
    perturb_factor: float = 1.2
    replace_fraction: float = 0.3
    replace_threshold: float = 0.0
    """An exchange needs source objective - target objective > this."""


@dataclass
class Decision:
    """What one update does to ``policy``; ``reason`` says why, for logs and history."""

    policy: int
    frames: int
    objective: float | None
    rank: int | None = None
    """0 = worst."""
    population: int = 0
    source: int | None = None
    """Copy weights and hyperparameters from this policy."""
    mutations: dict[str, tuple[float, float]] = field(default_factory=dict)
    hyperparams: dict[str, float] = field(default_factory=dict)
    """The policy's hyperparameters after the update."""
    reason: str = ""

    @property
    def changed(self) -> bool:
        """The update copies or mutates something."""
        return self.source is not None or bool(self.mutations)


def perturb(name: str, value: float, up: bool, factor: float) -> float:
    """``value`` times ``factor`` (up) or divided by it; ``1 - x`` for betas and the discount."""
    if name.endswith(COMPLEMENT_SUFFIXES):
        rest = 1.0 - value
        return 1.0 - min(rest * factor if not up else rest / factor, 1.0)
    return value * factor if up else value / factor


def ranking(objectives: dict[int, float]) -> list[int]:
    """Policies from worst to best objective (ties: lower policy id counts as worse)."""
    return sorted(objectives, key=lambda p: (objectives[p], p))


def decide(policy: int, frames: int, objectives: dict[int, float],
           hyperparams: dict[int, dict[str, float]], rules: PbtRules, rng: np.random.Generator,
           unavailable: frozenset[int] = frozenset()) -> Decision:
    """The update of ``policy`` now (``objectives``: the policies that have one; ``unavailable``:
    policies in an exchange still in flight, which are not drawn as sources)."""
    own = dict(hyperparams[policy])
    decision = Decision(policy, frames, objectives.get(policy), hyperparams=own,
                        population=len(objectives))
    if policy not in objectives or len(objectives) < 2:
        decision.reason = "waiting: fewer than 2 policies have finished episodes"
        return decision
    ranked = ranking(objectives)
    n = len(ranked)
    k = max(1, math.ceil(rules.replace_fraction * n))
    rank = decision.rank = ranked.index(policy)
    best, worst = ranked[n - k:], ranked[:k]
    if policy in best:
        decision.reason = f"kept: rank {rank + 1}/{n}, in the best {k}"
        return decision
    reasons = [f"rank {rank + 1}/{n} (below the best {k})"]
    if policy in worst:
        candidates = [p for p in best if p not in unavailable]
        if not candidates:
            reasons.append("no exchange: every best policy is busy in another exchange")
        else:
            source = int(candidates[rng.integers(len(candidates))])
            gap = objectives[source] - objectives[policy]
            if gap > rules.replace_threshold:
                decision.source = source
                own = decision.hyperparams = dict(hyperparams[source])
                reasons.append(f"in the worst {k}: copies policy {source} (objective "
                               f"{objectives[source]:.4g}, gap {gap:.4g} > "
                               f"{rules.replace_threshold:g})")
            else:
                reasons.append(f"in the worst {k}, no exchange: policy {source} is better by "
                               f"{gap:.4g} <= {rules.replace_threshold:g}")
    for name in sorted(own):
        if rng.random() < rules.mutation_rate:
            up = bool(rng.random() < 0.5)
            new = perturb(name, own[name], up, rules.perturb_factor)
            decision.mutations[name] = (own[name], new)
            own[name] = new
    reasons.append(f"mutated {len(decision.mutations)} of {len(own)}" if decision.mutations
                   else "no mutation drawn")
    decision.reason = "; ".join(reasons)
    return decision


class Population:
    """PBT's view of the population: objectives, frames, hyperparameters and the schedule."""

    def __init__(self, hyperparams: dict[int, dict[str, float]], rules: PbtRules,
                 rng: np.random.Generator,
                 objective: Literal["true_return", "episode_return", "win_rate"] = "true_return",
                 window: int = 100) -> None:
        self.rules = rules
        self.rng = rng
        self.objective = objective
        self.hyperparams = {p: dict(h) for p, h in hyperparams.items()}
        self.returns: dict[int, deque[float]] = {p: deque(maxlen=window) for p in hyperparams}
        self.frames = dict.fromkeys(hyperparams, 0)
        self.last_update = dict.fromkeys(hyperparams, 0)
        self.pending: dict[int, tuple[int, int]] = {}
        """Exchanges in flight: id -> (target, source)."""
        self.next_exchange = 0
        self.updates = 0

    def add_episode(self, policy: int, episode_return: float, true_return: float,
                    win: float = math.nan) -> None:
        """Record a finished episode (``true_return`` NaN: the env has no separate score;
        ``win`` NaN: not a match, which a ``win_rate`` objective skips)."""
        if policy not in self.returns:
            return
        if self.objective == "win_rate":
            if not math.isnan(win):
                self.returns[policy].append(win)
            return
        use_true = self.objective == "true_return" and not math.isnan(true_return)
        self.returns[policy].append(true_return if use_true else episode_return)

    def objectives(self) -> dict[int, float]:
        """Mean return (or win rate) over the recent episodes of each policy that has some."""
        return {p: sum(r) / len(r) for p, r in self.returns.items() if r}

    def busy(self) -> frozenset[int]:
        """Policies in an exchange in flight."""
        return frozenset(p for pair in self.pending.values() for p in pair)

    def due(self, policy: int) -> bool:
        """The policy has trained ``interval`` frames since its last update, past the delay."""
        frames = self.frames[policy]
        return (frames >= self.rules.start_delay
                and frames - self.last_update[policy] >= self.rules.interval)

    def update(self, policy: int, frames: int) -> tuple[Decision, int | None] | None:
        """Record the policy's trained frames; when its update is due, make it.

        Returns the decision and, for a weight exchange, its id; None when nothing is due or the
        update waits (no objective yet, or the policy is busy in an exchange).
        """
        self.frames[policy] = max(self.frames[policy], frames)
        if not self.due(policy) or policy in self.busy():
            return None
        decision = decide(policy, self.frames[policy], self.objectives(), self.hyperparams,
                          self.rules, self.rng, self.busy())
        if decision.rank is None:
            return None  # no objective yet: try again at its next training step
        self.last_update[policy] = self.frames[policy]
        self.hyperparams[policy] = dict(decision.hyperparams)
        self.updates += 1
        exchange = None
        if decision.source is not None:
            exchange = self.next_exchange
            self.next_exchange += 1
            self.pending[exchange] = (policy, decision.source)
        return decision, exchange

    def exchange_done(self, exchange: int) -> tuple[int, int] | None:
        """An exchange finished: forget it. The target's old episodes no longer describe it; the
        source's recent ones do (it is now the same network), until its own replace them."""
        pair = self.pending.pop(exchange, None)
        if pair is not None:
            target, source = pair
            self.returns[target].clear()
            self.returns[target].extend(self.returns[source])
        return pair

    def state(self) -> dict[str, Any]:
        """Everything needed to resume (plain values: a weights-only checkpoint)."""
        return {"hyperparams": self.hyperparams, "last_update": self.last_update,
                "frames": self.frames, "returns": {p: list(r) for p, r in self.returns.items()},
                "next_exchange": self.next_exchange, "updates": self.updates,
                "rng": self.rng.bit_generator.state}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from ``state``; policies it does not know keep their initial values."""
        for p in self.hyperparams:
            if p in state["hyperparams"]:
                self.hyperparams[p].update(state["hyperparams"][p])
                self.last_update[p] = int(state["last_update"][p])
                self.frames[p] = int(state["frames"][p])
                self.returns[p].extend(state["returns"][p])
        self.next_exchange = int(state["next_exchange"])
        self.updates = int(state["updates"])
        self.rng.bit_generator.state = state["rng"]
