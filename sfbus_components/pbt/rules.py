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

Sample Factory 2.x adds four rules, each a setting here (its values in brackets; the defaults
keep the paper's schedule): policies 1..N-1 start mutated so the population starts diverse
(``initial_mutation`` [on]); a mutation puts a hyperparameter back to its configured value
instead, now and then (``reset_to_default`` [0.01]); an exchange also needs the gap relative to
the source's objective (``replace_threshold_relative`` [0.1], beside the absolute
``replace_threshold`` [1e-6]); the mutation factor is drawn from a range (``perturb_min`` ..
``perturb_max`` [1.1 .. 1.5]).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Objective = Literal["true_return", "episode_return", "win_rate", "league_rating",
                    "league_snapshot_rating"]
"""What PBT ranks by: episodes' scores or win rate, or a league's Elo rating (set, not averaged:
:meth:`Population.set_rating`)."""
COMPLEMENT_SUFFIXES = ("adam_beta1", "adam_beta2", "gamma")
"""Hyperparameters mutated as ``1 - x``."""
_EPS = 1e-8  # the relative gap's floor on the source objective's magnitude


@dataclass(frozen=True)
class PbtRules:
    """The numbers of the PBT schedule."""

    interval: int = 5_000_000
    """Env frames of a policy between two of its updates."""
    start_delay: int = 0
    """Env frames a policy trains before its first update (mutation or exchange)."""
    mutation_rate: float = 0.15
    """Chance that an update mutates a given hyperparameter."""
    perturb_min: float = 1.2
    """Smallest mutation factor: a mutation multiplies or divides by a factor drawn uniformly
    from [perturb_min, perturb_max]."""
    perturb_max: float = 1.2
    """Largest mutation factor (equal to ``perturb_min``: a fixed factor, the paper's 1.2)."""
    replace_fraction: float = 0.3
    replace_threshold: float = 0.0
    """An exchange needs source objective - target objective > this."""
    replace_threshold_relative: float = 0.0
    """... and that gap above this fraction of the source objective's magnitude."""
    initial_mutation: bool = False
    """Policies other than the lowest-numbered start with their hyperparameters mutated."""
    reset_to_default: float = 0.0
    """Chance that a mutation sets the hyperparameter back to its configured value instead."""

    def __post_init__(self) -> None:
        if not 1.0 <= self.perturb_min <= self.perturb_max:
            raise ValueError(f"need 1 <= perturb_min <= perturb_max, got {self.perturb_min} and "
                             f"{self.perturb_max}")
        for name in ("mutation_rate", "replace_fraction", "reset_to_default"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.replace_threshold_relative < 0:
            raise ValueError("replace_threshold_relative must be >= 0, got "
                             f"{self.replace_threshold_relative}")


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


def mutate(values: dict[str, float], defaults: dict[str, float], rules: PbtRules,
           rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """Mutate ``values`` in place, each with probability ``mutation_rate``: back to its default
    (chance ``reset_to_default``, when it differs) or by a factor from the range, up or down.
    Returns name -> (old, new) of those changed."""
    mutations = {}
    for name in sorted(values):
        if rng.random() >= rules.mutation_rate:
            continue
        old = values[name]
        if rules.reset_to_default and old != defaults[name] \
                and rng.random() < rules.reset_to_default:
            new = defaults[name]
        else:
            up = bool(rng.random() < 0.5)
            factor = rules.perturb_min if rules.perturb_max == rules.perturb_min \
                else float(rng.uniform(rules.perturb_min, rules.perturb_max))
            new = perturb(name, old, up, factor)
        mutations[name] = (old, new)
        values[name] = new
    return mutations


def decide(policy: int, frames: int, objectives: dict[int, float],
           hyperparams: dict[int, dict[str, float]], rules: PbtRules, rng: np.random.Generator,
           unavailable: frozenset[int] = frozenset(),
           defaults: dict[str, float] | None = None) -> Decision:
    """The update of ``policy`` now (``objectives``: the policies that have one; ``unavailable``:
    policies in an exchange still in flight, which are not drawn as sources; ``defaults``: the
    configured values ``reset_to_default`` returns to, the policy's own by default)."""
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
            relative = abs(gap) / max(abs(objectives[source]), _EPS)
            if gap > rules.replace_threshold and relative > rules.replace_threshold_relative:
                decision.source = source
                own = decision.hyperparams = dict(hyperparams[source])
                reasons.append(f"in the worst {k}: copies policy {source} (objective "
                               f"{objectives[source]:.4g}, gap {gap:.4g} > "
                               f"{rules.replace_threshold:g})")
            else:
                reasons.append(f"in the worst {k}, no exchange: policy {source} is better by "
                               f"{gap:.4g} (relative {relative:.3g}), not more than "
                               f"{rules.replace_threshold:g} (relative "
                               f"{rules.replace_threshold_relative:g})")
    decision.mutations = mutate(own, hyperparams[policy] if defaults is None else defaults,
                                rules, rng)
    reasons.append(f"mutated {len(decision.mutations)} of {len(own)}" if decision.mutations
                   else "no mutation drawn")
    decision.reason = "; ".join(reasons)
    return decision


class Population:
    """PBT's view of the population: objectives, frames, hyperparameters and the schedule."""

    def __init__(self, hyperparams: dict[int, dict[str, float]], rules: PbtRules,
                 rng: np.random.Generator,
                 objective: Objective = "true_return", window: int = 100) -> None:
        self.rules = rules
        self.rng = rng
        self.objective = objective
        self.defaults = {p: dict(h) for p, h in hyperparams.items()}
        """Each policy's configured values (what ``reset_to_default`` returns to)."""
        self.hyperparams = {p: dict(h) for p, h in hyperparams.items()}
        self.initial_mutations: dict[int, dict[str, tuple[float, float]]] = {}
        """With ``initial_mutation``: what each policy but the lowest-numbered started with."""
        if rules.initial_mutation:
            for policy in sorted(self.hyperparams)[1:]:
                self.initial_mutations[policy] = mutate(self.hyperparams[policy],
                                                        self.defaults[policy], rules, rng)
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
        if policy not in self.returns or self.objective.startswith("league_"):
            return
        if self.objective == "win_rate":
            if not math.isnan(win):
                self.returns[policy].append(win)
            return
        use_true = self.objective == "true_return" and not math.isnan(true_return)
        self.returns[policy].append(true_return if use_true else episode_return)

    def set_rating(self, policy: int, rating: float) -> None:
        """A ``league_*`` objective: ``rating`` is now the policy's objective (NaN: none yet)."""
        if policy in self.returns and not math.isnan(rating):
            self.returns[policy].clear()
            self.returns[policy].append(rating)

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
                          self.rules, self.rng, self.busy(), self.defaults[policy])
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
