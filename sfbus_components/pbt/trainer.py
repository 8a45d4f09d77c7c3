"""The population-based training actor: ranks the population, mutates, exchanges weights.

It listens to every ``EpisodeFinished`` (the objective: mean return of a policy's recent
episodes; the env's unshaped score when it reports one; in self-play the win rate of its recent
matches, whose winners and losers it also counts) and every learner's ``TrainingStats``
(frames trained per policy, which drive the schedule). The rules are in
:mod:`sfbus_components.pbt.rules`. A decision sends ``HyperparamsChanged`` (the policy's whole
set) to the learners and rollout workers, and for an exchange ``ReplacePolicy`` to the learners,
which make it atomic (see :mod:`sfbus_components.learning.population_member`). Each decision is
logged with its reason and appended to ``RUN_DIR/pbt_history.jsonl``; the state is checkpointed
to ``RUN_DIR/checkpoints/pbt/`` after each decision and resumed from there; hyperparameters, the
objective and counts of mutations and exchanges are Prometheus metrics.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sfbus import (
    Actor,
    ArraySpec,
    RunRecords,
    Seconds,
    Signal,
    Topology,
    import_actor_class,
    slot,
)
from sfbus_components.algo import AppoConfig
from sfbus_components.datapath.messages import (
    EpisodeFinished,
    HyperparamsChanged,
    LeagueRatings,
    PolicyReplaced,
    ReplacePolicy,
    TrainingStats,
)
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.envs import make_env
from sfbus_components.learning.checkpoint import load_newest, save_checkpoint
from sfbus_components.learning.population_member import (
    MemberParams,
    is_population_member,
    prune_snapshots,
)
from sfbus_components.pbt.rules import Decision, Objective, PbtRules, Population

_STATE_KEYS = ("hyperparams", "last_update", "frames", "returns", "next_exchange", "updates",
               "rng", "exchanges", "mutations")


def population_learners(topology: Topology, num_policies: int) -> dict[int, MemberParams]:
    """Each policy's learner parameters; raises unless every policy has exactly one learner
    (an actor that takes weight exchanges:
    :func:`sfbus_components.learning.population_member.is_population_member`)."""
    found: dict[int, list[MemberParams]] = {}
    for process in topology.processes:
        for spec in process.actors:
            if is_population_member(import_actor_class(spec.class_path)):
                found.setdefault(spec.params.policy, []).append(spec.params)
    wrong = [p for p in range(num_policies) if len(found.get(p, ())) != 1]
    extra = sorted(set(found) - set(range(num_policies)))
    if wrong or extra:
        raise ValueError(f"PBT needs one learner per policy 0..{num_policies - 1} "
                         f"(num_policies); policies without exactly one: {wrong}, learners of "
                         f"unknown policies: {extra}")
    return {p: params[0] for p, params in found.items()}


def env_shaping(params: DataPathParams, mutable: tuple[str, ...]) -> dict[str, float]:
    """The env's reward shaping: ``env_kwargs['reward_shaping']``, else (only when ``mutable``
    names a ``reward_shaping.*`` pattern) the env's own defaults."""
    shaping = params.env_kwargs.get("reward_shaping")
    if shaping is None and any(m.startswith("reward_shaping.") for m in mutable):
        env = make_env(params.env, **params.env_kwargs)  # the env's own defaults
        try:
            shaping = dict(getattr(env, "reward_shaping", None) or {})
        finally:
            env.close()
    return dict(shaping or {})


def initial_hyperparams(mutable: tuple[str, ...], learner: MemberParams,
                        shaping: dict[str, float]) -> dict[str, float]:
    """The starting values of every hyperparameter ``mutable`` names, from the policy's learner
    parameters and the env's reward ``shaping``; raises ``ValueError`` for an unknown name."""
    values: dict[str, float] = {}
    for pattern in mutable:
        if pattern.startswith("reward_shaping."):
            key = pattern.removeprefix("reward_shaping.")
            values.update({f"reward_shaping.{k}": float(v) for k, v in shaping.items()
                           if fnmatch.fnmatchcase(k, key)})
        elif pattern.startswith("appo.") and hasattr(learner.appo, pattern[5:]):
            values[pattern] = float(getattr(learner.appo, pattern[5:]))
        elif pattern == "reward_scale":
            values[pattern] = float(learner.reward_scale)
        else:
            raise ValueError(f"pbt.mutable: unknown hyperparameter {pattern!r}")
    return values


class PopulationTrainer(Actor):
    """Population-based training of the run's ``num_policies`` policies (paper, A.3.1)."""

    component = "pbt"
    records = (DataPath,)

    @dataclass(frozen=True)
    class Params(PbtRules):
        """The PBT schedule (``PbtRules``' fields) plus the trainer's own; env, seed and
        population size are the run's data path's (``context.records[DataPath].params``)."""

        objective: Objective = "true_return"
        """Mean of the recent episodes' unshaped score (``true_return``; the return when the
        env does not shape rewards), of their (shaped) return, the recent matches' win rate
        (``win_rate``: 1 for outscoring the opponent, 0 otherwise; self-play), or a league's
        Elo rating of the policy (``league_rating``) or of its newest snapshot
        (``league_snapshot_rating``), from ``LeagueRatings`` (:mod:`sfbus_components.league`)."""
        objective_episodes: int = 100
        """Recent episodes per policy in the objective."""
        mutable: tuple[str, ...] = ("appo.lr", "appo.entropy_coeff", "appo.adam_beta1",
                                    "reward_shaping.*")
        """Hyperparameters PBT mutates: ``appo.<field>``, ``reward_scale``,
        ``reward_shaping.<key>`` (``*`` patterns match the env's shaping keys)."""
        appo: AppoConfig = field(default_factory=AppoConfig)
        """Unused here (the learners' own values are read); lets ``appo`` settings resolve."""
        keep_checkpoints: int = 3
        """PBT checkpoints and exchange snapshots kept."""
        announce_every_s: Seconds = 60.0
        """Seconds between re-sending every policy's hyperparameters (a restarted rollout
        worker or learner gets them back; 0: only on changes)."""

    hyperparams_changed = Signal(HyperparamsChanged, "a policy's PBT-managed hyperparameters")
    replace_policy = Signal(ReplacePolicy, "a weight exchange: target copies source")

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """None: the launcher's hook refuses, before anything starts, a population whose
        policies cannot take each other's weights (agent_policies of different spaces)."""
        specs = records[DataPath].layout.policy_specs
        if any(not spec.spaces_equal(specs[0]) for spec in specs):
            raise ValueError("PBT copies weights between the policies, but agent_policies gives "
                             "them agents of different spaces, so their models differ")
        return []

    async def on_start(self) -> None:
        """Read the initial hyperparameters, resume a checkpoint, announce every policy's set."""
        p, data = self.params, self.context.records[DataPath].params
        self.started = time.monotonic()
        learners = population_learners(self.context.table.topology, data.num_policies)
        shaping = env_shaping(data, p.mutable)
        initial = {policy: initial_hyperparams(p.mutable, learners[policy], shaping)
                   for policy in range(data.num_policies)}
        rules = PbtRules(**{f.name: getattr(p, f.name) for f in dataclasses.fields(PbtRules)})
        self.population = Population(initial, rules, np.random.default_rng([data.seed, 0x9B7]),
                                     p.objective, p.objective_episodes)
        self.exchanges = 0
        self.mutations = 0
        self.wins: dict[tuple[int, int], int] = {}
        """Self-play results: (winner, loser) policies -> matches."""
        self._wins_logged = 0
        run_dir = self.context.run_dir
        self.history = None if run_dir is None else Path(run_dir, "pbt_history.jsonl")
        self.checkpoint_dir = None if run_dir is None else Path(run_dir, "checkpoints", "pbt")
        newest = None if self.checkpoint_dir is None else load_newest(
            self.checkpoint_dir, required=_STATE_KEYS, kind="PBT", log=self.log)
        if newest is None:  # a fresh start: the population's initial diversity, if any
            for policy, mutations in self.population.initial_mutations.items():
                self.mutations += len(mutations)
                self._record({"event": "initial_mutation", "policy": policy,
                              "mutations": {n: list(v) for n, v in mutations.items()},
                              "hyperparams": self.population.hyperparams[policy]})
        else:
            latest, state = newest
            self.population.restore(state)
            self.exchanges, self.mutations = int(state["exchanges"]), int(state["mutations"])
            self.log.info("%s: resumed from %s (%d updates)", self.name, latest,
                          self.population.updates)
        family = self.metrics
        self._m_hyper = family.gauge_family("sfbus_pbt_hyperparameter",
                                            "Current PBT-managed hyperparameters",
                                            ("policy", "param"))
        self._m_objective = family.gauge_family("sfbus_pbt_objective",
                                                "PBT objective (mean recent return)", ("policy",))
        self._m_mutations = family.counter_family("sfbus_pbt_mutations_total",
                                                  "Hyperparameters mutated", ("policy",))
        self._m_exchanges = family.counter_family("sfbus_pbt_exchanges_total",
                                                  "Weight exchanges started, by target policy",
                                                  ("policy",))
        self._m_matches = family.counter_family("sfbus_selfplay_matches_total",
                                                "1v1 matches won, by winner and loser policy",
                                                ("winner", "loser"))
        for policy in range(data.num_policies):
            self._announce(policy)
        if p.announce_every_s > 0:
            self.every(p.announce_every_s, self._announce_all)
        self.log.info("%s: %d policies, update every %s frames after %s; mutable %s",
                      self.name, data.num_policies, f"{p.interval:,}", f"{p.start_delay:,}",
                      sorted(initial[0]))

    # ----- inputs ----------------------------------------------------------------------------

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Add an episode to its policy's objective; count a 1v1 match's winner and loser."""
        self.population.add_episode(msg.policy, msg.episode_return, msg.true_return, msg.win)
        if msg.win == 1.0 and msg.opponent >= 0:  # the loser's episode says win 0: count once
            pair = (msg.policy, msg.opponent)
            self.wins[pair] = self.wins.get(pair, 0) + 1
            self._m_matches.labels(str(msg.policy), str(msg.opponent)).inc()

    @slot
    def on_league_ratings(self, msg: LeagueRatings) -> None:
        """A ``league_*`` objective: take the policy's rating (or its newest snapshot's)."""
        if self.params.objective == "league_rating":
            self.population.set_rating(msg.policy, msg.rating)
        elif self.params.objective == "league_snapshot_rating":
            self.population.set_rating(msg.policy, msg.snapshot_rating)

    @slot
    def on_training_stats(self, msg: TrainingStats) -> None:
        """Advance the policy's schedule; make its update when due."""
        if msg.policy not in self.population.frames:
            return
        made = self.population.update(msg.policy, msg.env_frames)
        if made is not None:
            self._apply(*made)

    @slot
    def on_policy_replaced(self, msg: PolicyReplaced) -> None:
        """Record a finished (or failed) exchange."""
        if self.population.exchange_done(msg.exchange) is None:
            return
        if self.context.run_dir is not None:
            prune_snapshots(self.context.run_dir, self.params.keep_checkpoints,
                            set(self.population.pending))
        event = "exchange_done" if msg.ok else "exchange_failed"
        self.log.info("%s: exchange %d %s: policy %d is a copy of policy %d (its version %d) "
                      "as version %d", self.name, msg.exchange,
                      "done" if msg.ok else "FAILED", msg.policy, msg.source, msg.source_version,
                      msg.version)
        self._record({"event": event, "exchange": msg.exchange, "policy": msg.policy,
                      "source": msg.source, "version": msg.version,
                      "source_version": msg.source_version})

    # ----- outputs ---------------------------------------------------------------------------

    def _apply(self, decision: Decision, exchange: int | None) -> None:
        policy = decision.policy
        objectives = self.population.objectives()
        for p, value in objectives.items():
            self._m_objective.labels(str(p)).set(value)
        if exchange is not None:
            # Weights first, then hyperparameters: the target's mailbox applies them in order.
            self.replace_policy.emit(ReplacePolicy(policy, decision.source, exchange))
            self.exchanges += 1
            self._m_exchanges.labels(str(policy)).inc()
        if decision.mutations:
            self.mutations += len(decision.mutations)
            self._m_mutations.labels(str(policy)).inc(len(decision.mutations))
        if decision.changed:
            self._announce(policy)
        changes = ", ".join(f"{n} {a:.4g} -> {b:.4g}" for n, (a, b) in decision.mutations.items())
        self.log.info("%s: policy %d at %s frames (objective %s): %s%s", self.name, policy,
                      f"{decision.frames:,}", _fmt(decision.objective), decision.reason,
                      f" ({changes})" if changes else "")
        event = "exchange" if exchange is not None else "mutation" if decision.mutations \
            else "keep"
        self._record({
            "event": event, "policy": policy, "frames": decision.frames,
            "objective": decision.objective, "rank": decision.rank,
            "population": decision.population, "source": decision.source, "exchange": exchange,
            "mutations": {n: list(v) for n, v in decision.mutations.items()},
            "hyperparams": decision.hyperparams, "reason": decision.reason,
            "objectives": {str(p): v for p, v in objectives.items()},
            "objective_kind": self.params.objective,
            "wins": {f"{w}>{lo}": n for (w, lo), n in sorted(self.wins.items())}})
        self._save()

    def _announce_all(self) -> None:
        for policy in self.population.hyperparams:
            self._announce(policy)
        total = sum(self.wins.values())
        if total != self._wins_logged:  # who beats whom, when new matches were won
            self._wins_logged = total
            self.log.info("%s: self-play wins (winner>loser: matches): %s", self.name,
                          _fmt_wins(self.wins))

    def _announce(self, policy: int) -> None:
        values = self.population.hyperparams[policy]
        names = tuple(sorted(values))
        self.hyperparams_changed.emit(HyperparamsChanged(policy, names,
                                                         tuple(values[n] for n in names)))
        for name in names:
            self._m_hyper.labels(str(policy), name).set(values[name])

    def _record(self, entry: dict[str, Any]) -> None:
        if self.history is None:
            return
        entry = {"time": round(time.time(), 3),
                 "run_seconds": round(time.monotonic() - self.started, 3), **entry}
        with self.history.open("a") as out:
            out.write(json.dumps(entry) + "\n")

    def state(self) -> dict[str, Any]:
        """The PBT checkpoint: the population's state and the counters."""
        return {**self.population.state(), "exchanges": self.exchanges,
                "mutations": self.mutations}

    def _save(self) -> None:
        if self.checkpoint_dir is not None:
            save_checkpoint(self.checkpoint_dir, self.state(), self.population.updates,
                            self.params.keep_checkpoints)

    async def on_stop(self) -> None:
        """Write the final checkpoint."""
        if hasattr(self, "population"):
            self._save()


def _fmt_wins(wins: dict[tuple[int, int], int]) -> str:
    return ", ".join(f"{w}>{lo}: {n}" for (w, lo), n in sorted(wins.items()))


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g}"
