"""The PBT rules without processes: who is mutated and by how much, who copies whom, the
threshold, the start delay and the schedule's bookkeeping."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from sfbus_components.pbt.rules import PbtRules, Population, decide, perturb, ranking

HP = {"appo.lr": 1e-4, "appo.entropy_coeff": 0.003, "appo.adam_beta1": 0.9,
      "reward_shaping.damage": 0.01}


def population_hp(n: int) -> dict[int, dict[str, float]]:
    """Distinct hyperparameters per policy, so a copy is recognisable."""
    return {p: {k: v * (1 + p) if k != "appo.adam_beta1" else v for k, v in HP.items()}
            for p in range(n)}


def objectives(n: int) -> dict[int, float]:
    """Policy p has objective 10 * p: policy 0 is the worst, n - 1 the best."""
    return {p: 10.0 * p for p in range(n)}


def test_perturb_multiplies_or_divides_and_keeps_betas_below_one() -> None:
    assert perturb("appo.lr", 1e-4, True, 1.2) == pytest.approx(1.2e-4)
    assert perturb("appo.lr", 1e-4, False, 1.2) == pytest.approx(1e-4 / 1.2)
    # Adam's beta1 moves through 1 - beta: up means closer to 1, never past it.
    assert perturb("appo.adam_beta1", 0.9, True, 1.2) == pytest.approx(1 - 0.1 / 1.2)
    assert perturb("appo.adam_beta1", 0.9, False, 1.2) == pytest.approx(1 - 0.12)
    beta = 0.9
    for _ in range(50):
        beta = perturb("appo.adam_beta1", beta, True, 1.2)
    assert 0.9 < beta < 1.0
    assert perturb("appo.adam_beta1", 0.05, False, 1.2) == 0.0  # 1 - beta capped at 1


def test_ranking_is_worst_first_with_ties_by_id() -> None:
    assert ranking({3: 1.0, 0: 5.0, 2: 1.0, 1: -2.0}) == [1, 2, 3, 0]


def test_best_30_percent_are_kept() -> None:
    rules = PbtRules(mutation_rate=1.0)
    for policy in (5, 6, 7):  # ceil(0.3 * 8) = 3 best of 8
        d = decide(policy, 100, objectives(8), population_hp(8), rules, np.random.default_rng(0))
        assert not d.changed and d.hyperparams == population_hp(8)[policy]
        assert d.reason.startswith("kept") and d.rank == policy


def test_middle_policies_mutate_only() -> None:
    rules = PbtRules(mutation_rate=1.0)  # every hyperparameter mutates
    for policy in (3, 4):
        d = decide(policy, 100, objectives(8), population_hp(8), rules, np.random.default_rng(1))
        assert d.source is None
        assert set(d.mutations) == set(HP)
        for name, (old, new) in d.mutations.items():
            assert old == population_hp(8)[policy][name]
            assert new == pytest.approx(perturb(name, old, new > old, 1.2))
            assert d.hyperparams[name] == new


def test_worst_30_percent_copy_a_best_policy_then_mutate() -> None:
    rules = PbtRules(mutation_rate=0.0)
    sources = set()
    for seed in range(40):
        d = decide(0, 100, objectives(8), population_hp(8), rules, np.random.default_rng(seed))
        assert d.source in (5, 6, 7)
        assert d.hyperparams == population_hp(8)[d.source] and not d.mutations
        sources.add(d.source)
    assert sources == {5, 6, 7}  # drawn among all of the best
    # with mutations on, they apply to the copied values
    d = decide(2, 100, objectives(8), population_hp(8), PbtRules(mutation_rate=1.0),
               np.random.default_rng(3))
    assert d.source in (5, 6, 7)
    assert all(old == population_hp(8)[d.source][n] for n, (old, _) in d.mutations.items())


def test_replace_threshold_blocks_close_policies() -> None:
    close = {0: 0.50, 1: 0.60, 2: 0.70, 3: 0.80}  # win rates; k = ceil(1.2) = 2
    hp = population_hp(4)
    rules = PbtRules(mutation_rate=0.0, replace_threshold=0.35)
    d = decide(0, 1, close, hp, rules, np.random.default_rng(0))
    assert d.source is None and "no exchange" in d.reason and not d.changed
    far = {**close, 3: 0.90}
    # policy 0 copies policy 3 (gap 0.40 > 0.35) but not policy 2 (0.20): try seeds for both
    results = {decide(0, 1, far, hp, rules, np.random.default_rng(s)).source for s in range(20)}
    assert results == {None, 3}


def test_mutation_rate_and_direction_statistics() -> None:
    rng = np.random.default_rng(7)
    rules = PbtRules(mutation_rate=0.15)
    mutated, ups, draws = 0, 0, 0
    for _ in range(2000):
        d = decide(3, 1, objectives(8), population_hp(8), rules, rng)
        draws += len(HP)
        mutated += len(d.mutations)
        ups += sum(new > old for name, (old, new) in d.mutations.items())
    assert mutated / draws == pytest.approx(0.15, abs=0.02)
    assert ups / mutated == pytest.approx(0.5, abs=0.05)


def test_same_seed_same_decisions() -> None:
    def run(seed: int) -> list:
        rng = np.random.default_rng(seed)
        return [(d.source, d.mutations) for d in (
            decide(p, 1, objectives(8), population_hp(8), PbtRules(), rng) for p in range(8))]
    assert run(5) == run(5)


def test_schedule_start_delay_and_interval() -> None:
    pop = Population(population_hp(4), PbtRules(interval=100, start_delay=250,
                                                mutation_rate=0.0), np.random.default_rng(0))
    for p in range(4):
        for _ in range(3):
            pop.add_episode(p, 10.0 * p, math.nan)
    assert pop.update(0, 120) is None  # past the interval, before the delay
    assert pop.update(0, 249) is None
    made = pop.update(0, 250)
    assert made is not None
    decision, exchange = made
    assert decision.source in (2, 3) and exchange == 0
    assert pop.pending == {0: (0, decision.source)}
    assert pop.hyperparams[0] == population_hp(4)[decision.source]
    assert pop.update(0, 400) is None  # busy until the exchange is done
    # a busy source is not drawn: policy 1 copies the other best one
    decision1, exchange1 = pop.update(1, 300)
    assert decision1.source == 5 - decision.source and exchange1 == 1
    source = decision.source
    assert pop.exchange_done(0) == (0, source)
    # the target's old episodes are forgotten; the source's describe the copy
    assert list(pop.returns[0]) == list(pop.returns[source])
    pop.add_episode(0, 50.0, math.nan)
    decision, exchange = pop.update(0, 401)  # 401 - 250 >= 100, now ranked best
    assert exchange is None and decision.reason.startswith("kept")
    assert pop.update(0, 450) is None and pop.last_update[0] == 401


def test_updates_wait_for_objectives() -> None:
    pop = Population(population_hp(2), PbtRules(interval=10), np.random.default_rng(0))
    assert pop.update(0, 50) is None  # nobody has episodes
    pop.add_episode(0, 1.0, math.nan)
    assert pop.update(0, 60) is None  # only one policy ranked
    assert pop.last_update[0] == 0


def test_objective_prefers_the_unshaped_score() -> None:
    pop = Population(population_hp(2), PbtRules(), np.random.default_rng(0))
    pop.add_episode(0, episode_return=12.0, true_return=3.0)
    pop.add_episode(1, episode_return=7.0, true_return=math.nan)  # env without a separate score
    assert pop.objectives() == {0: 3.0, 1: 7.0}
    shaped = Population(population_hp(2), PbtRules(), np.random.default_rng(0),
                        objective="episode_return")
    shaped.add_episode(0, episode_return=12.0, true_return=3.0)
    assert shaped.objectives() == {0: 12.0}


def test_state_survives_a_weights_only_checkpoint() -> None:
    rules = PbtRules(interval=10, mutation_rate=0.5)
    pop = Population(population_hp(4), rules, np.random.default_rng(3))
    for p in range(4):
        pop.add_episode(p, float(p), math.nan)
    for p in range(4):
        pop.update(p, 20)
    buffer = io.BytesIO()
    torch.save(pop.state(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    resumed = Population(population_hp(4), rules, np.random.default_rng(99))
    resumed.restore(state)
    assert resumed.hyperparams == pop.hyperparams and resumed.last_update == pop.last_update
    assert resumed.next_exchange == pop.next_exchange
    assert resumed.objectives() == pop.objectives()
    assert resumed.rng.random() == pop.rng.random()  # the same draws continue


# --- Sample Factory 2.x's rules ----------------------------------------------------------------

def _factor(name: str, old: float, new: float) -> float:
    """The factor a mutation applied (through 1 - x for betas), >= 1 whichever the direction."""
    if name.endswith("adam_beta1"):
        old, new = 1.0 - old, 1.0 - new
    return max(new / old, old / new)


def test_initial_mutation_leaves_the_lowest_policy_as_configured() -> None:
    rules = PbtRules(initial_mutation=True, mutation_rate=1.0, perturb_min=1.1, perturb_max=1.5)
    configured = population_hp(4)
    pop = Population(configured, rules, np.random.default_rng(0))
    assert pop.hyperparams[0] == configured[0] and 0 not in pop.initial_mutations
    for policy in (1, 2, 3):
        mutations = pop.initial_mutations[policy]
        assert set(mutations) == set(HP)  # rate 1: every hyperparameter
        for name, (old, new) in mutations.items():
            assert old == configured[policy][name] and pop.hyperparams[policy][name] == new
            assert 1.1 <= _factor(name, old, new) <= 1.5
    assert pop.defaults == configured  # what reset_to_default returns to
    unchanged = Population(configured, PbtRules(mutation_rate=1.0), np.random.default_rng(0))
    assert unchanged.hyperparams == configured and not unchanged.initial_mutations


def test_mutation_factors_spread_over_the_range() -> None:
    rules = PbtRules(mutation_rate=1.0, perturb_min=1.1, perturb_max=1.5)
    rng = np.random.default_rng(1)
    factors = []
    for _ in range(200):
        d = decide(2, 100, objectives(8), population_hp(8), rules, rng)
        factors += [_factor(n, old, new) for n, (old, new) in d.mutations.items()]
    assert min(factors) >= 1.1 - 1e-9 and max(factors) <= 1.5 + 1e-9
    assert min(factors) < 1.15 and max(factors) > 1.45  # uniform over the range, not fixed
    assert abs(np.mean(factors) - 1.3) < 0.02


def test_reset_to_default_returns_to_the_configured_value() -> None:
    rules = PbtRules(mutation_rate=1.0, reset_to_default=1.0)
    hp = population_hp(8)  # policy 4: mutated, never an exchange target (not in the worst 3)
    defaults = {k: v / 7 for k, v in hp[4].items()}  # differ from the current values
    d = decide(4, 100, objectives(8), hp, rules, np.random.default_rng(0), defaults=defaults)
    assert d.hyperparams == defaults
    # a value already at its default is mutated as usual
    d = decide(4, 100, objectives(8), hp, rules, np.random.default_rng(0), defaults=hp[4])
    assert all(d.hyperparams[k] != v for k, v in hp[4].items())
    # at a rate of 0.01 about one mutation in a hundred resets
    rules = PbtRules(mutation_rate=1.0, reset_to_default=0.01)
    rng = np.random.default_rng(3)
    resets = sum(new == defaults[n] for _ in range(2000)
                 for n, (_, new) in decide(4, 100, objectives(8), hp, rules, rng,
                                           defaults=defaults).mutations.items())
    assert 40 < resets < 130  # 8000 mutations, expected 80


def test_relative_gap_blocks_an_exchange_between_close_policies() -> None:
    rules = PbtRules(mutation_rate=0.0, replace_threshold=1e-6, replace_threshold_relative=0.1)
    hp = population_hp(4)
    close = {0: 95.0, 1: 96.0, 2: 97.0, 3: 100.0}  # 0 is worst; source 3 better by 5%
    d = decide(0, 100, close, hp, rules, np.random.default_rng(0))
    assert d.source is None and "relative" in d.reason
    far = {0: 50.0, 1: 96.0, 2: 97.0, 3: 100.0}  # better by 50%
    d = decide(0, 100, far, hp, rules, np.random.default_rng(0))
    assert d.source == 3
    negative = {0: -100.0, 1: -96.0, 2: -97.0, 3: -60.0}  # magnitude of the source: 40/60
    assert decide(0, 100, negative, hp, rules, np.random.default_rng(0)).source == 3


@pytest.mark.parametrize("kwargs", [{"perturb_min": 0.9}, {"perturb_min": 1.5, "perturb_max": 1.2},
                                    {"reset_to_default": 1.5}, {"mutation_rate": -0.1},
                                    {"replace_threshold_relative": -1.0}])
def test_bad_rules_are_refused(kwargs) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PbtRules(**kwargs)
