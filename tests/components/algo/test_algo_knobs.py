"""Sample Factory's optimisation knobs, each against a reference written from its formula:
learning-rate schedules, LAMB, the symmetric-KL exploration loss, reward clipping and the
minibatch order."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import pytest
import torch

from sfbus_components.algo import AppoConfig
from sfbus_components.algo.lamb import Lamb
from sfbus_components.algo.lr_schedule import LrSchedule
from sfbus_components.models.distributions import ActionDistribution


def reference_kl_adaptive(lr: float, kl: float, threshold: float = 0.008, low: float = 1e-6,
                          high: float = 1e-2) -> float:
    """Sample Factory's rule written out: too far -> / 1.5, too close -> * 1.5, within bounds."""
    if kl > 2 * threshold:
        return max(lr / 1.5, low)
    if kl < threshold / 2:
        return min(lr * 1.5, high)
    return lr


def test_kl_adaptive_minibatch_follows_a_sequence_of_kls():
    schedule = LrSchedule("kl_adaptive_minibatch", 1e-4, 0.008, 1e-6, 1e-2, None)
    kls = [0.1, 0.1, 0.001, 0.009, 0.0, 0.0, 0.02, 0.0159]
    lr, expected, seen = 1e-4, 1e-4, []
    for kl in kls:
        seen.append(kl)
        lr = schedule.after_minibatch(lr, seen, 0.0)
        expected = reference_kl_adaptive(expected, kl)
        assert lr == pytest.approx(expected)
        assert schedule.after_epoch(lr, seen) == lr  # the per-minibatch schedule only
    assert lr == pytest.approx(1e-4 / 1.5**2 * 1.5**3 / 1.5)


def test_kl_adaptive_rates_stay_within_their_bounds():
    schedule = LrSchedule("kl_adaptive_minibatch", 1e-3, 0.008, 1e-4, 2e-3, None)
    lr = 1e-3
    for _ in range(20):
        lr = schedule.after_minibatch(lr, [1.0], 0.0)
    assert lr == 1e-4
    for _ in range(20):
        lr = schedule.after_minibatch(lr, [0.0], 0.0)
    assert lr == 2e-3


def test_kl_adaptive_epoch_uses_the_epochs_mean_kl():
    schedule = LrSchedule("kl_adaptive_epoch", 1e-4, 0.008, 1e-6, 1e-2, None)
    epoch = [0.001, 0.05, 0.002]  # mean 0.0177 > 0.016
    assert schedule.after_minibatch(1e-4, epoch[:1], 0.0) == 1e-4
    assert schedule.after_epoch(1e-4, epoch) == pytest.approx(1e-4 / 1.5)
    assert schedule.after_epoch(1e-4, [0.005, 0.01]) == 1e-4  # mean 0.0075: in the band


def test_linear_decay_reaches_zero_at_max_frames():
    schedule = LrSchedule("linear_decay", 3e-4, 0.008, 1e-6, 1e-2, 1000)
    assert schedule.after_minibatch(3e-4, [], 0) == pytest.approx(3e-4)
    assert schedule.after_minibatch(3e-4, [], 250) == pytest.approx(3e-4 * 0.75)
    assert schedule.after_minibatch(1e-9, [], 1000) == 0.0
    assert schedule.after_minibatch(1e-9, [], 5000) == 0.0
    with pytest.raises(ValueError, match="max-frames"):
        LrSchedule("linear_decay", 3e-4, 0.008, 1e-6, 1e-2, None)


def test_lamb_update_matches_its_formula():
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(5, 3, generator=gen), torch.zeros(4)]
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    lr, (b1, b2), eps = 0.01, (0.9, 0.99), 1e-6
    opt = Lamb(params, lr=lr, betas=(b1, b2), eps=eps)
    m = [torch.zeros_like(w) for w in weights]
    v = [torch.zeros_like(w) for w in weights]
    for _ in range(3):
        grads = [torch.randn(w.shape, generator=gen) for w in weights]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            step = m[i] / (v[i].sqrt() + eps)
            w_norm = min(float(weights[i].norm()), 10.0)
            s_norm = float(step.norm())
            trust = w_norm / s_norm if w_norm > 0 and s_norm > 0 else 1.0
            weights[i] = weights[i] - lr * trust * step
        for p, w in zip(params, weights, strict=True):
            torch.testing.assert_close(p.data, w)
    # the zero-initialised bias took plain Adam steps (trust 1) first, then scaled ones
    assert float(params[1].detach().norm()) > 0


def test_symmetric_kl_with_uniform_matches_a_direct_computation():
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    dist = ActionDistribution(logits=logits, action_heads=(3, 2))
    got = dist.symmetric_kl_with_uniform()
    for row in range(2):
        total = 0.0
        for head in (logits[row, :3], logits[row, 3:]):
            p = torch.softmax(head, -1).tolist()
            u = 1.0 / len(p)
            kl_pu = sum(pi * math.log(pi / u) for pi in p)
            kl_up = sum(u * math.log(u / pi) for pi in p)
            total += 0.5 * (kl_pu + kl_up)
        assert float(got[row]) == pytest.approx(total, rel=1e-5)
    assert float(got[1]) == pytest.approx(0.0, abs=1e-7)  # uniform: no divergence
    with pytest.raises(ValueError, match="categorical"):
        ActionDistribution(mean=torch.zeros(1, 2), log_std=torch.zeros(2)).\
            symmetric_kl_with_uniform()


@pytest.mark.parametrize("field,value", [("lr_schedule_kl_threshold", 0.0),
                                         ("lr_adaptive_min", -1.0), ("reward_clip", 0.0)])
def test_bad_knob_values_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        AppoConfig(**{field: value})


def test_adaptive_bounds_must_be_ordered():
    with pytest.raises(ValueError, match="lr_adaptive_min"):
        AppoConfig(lr_adaptive_min=1e-2, lr_adaptive_max=1e-3)


# --- the knobs inside a learner's update -----------------------------------------------------

def test_kl_adaptive_schedule_moves_the_learners_rate():
    from tests.components.learning.test_learner import bandit_batch, bandit_learner

    learner = bandit_learner(lr_schedule="kl_adaptive_minibatch", num_batches_per_epoch=2,
                             lr_schedule_kl_threshold=1e-9)  # every KL is "too far"
    lr = learner.training.lr
    batch = bandit_batch(learner, torch.Generator().manual_seed(0))
    batch["action_params"] += torch.tensor([2.0, -2.0])  # mu far off: every minibatch's KL > 0
    result = learner.train(batch)
    assert result["kl"] > 2e-9
    assert learner.training.lr == pytest.approx(lr / 1.5**2)  # one step down per minibatch
    state = learner.training.state_dict()  # the rate travels with the optimizer's state
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(lr / 1.5**2)


def test_pbt_sets_the_rate_only_under_a_constant_schedule():
    from tests.components.learning.test_learner import bandit_learner

    for schedule, expected in (("constant", 5e-3), ("kl_adaptive_epoch", 3e-3)):
        learner = bandit_learner(lr_schedule=schedule)
        learner.training.set_hyperparameters(replace(learner.params.appo, lr=5e-3))
        assert learner.training.lr == expected


def test_reward_clip_bounds_the_value_targets():
    from tests.components.learning.test_learner import bandit_batch, bandit_learner

    for clip in (1000.0, 0.5):
        learner = bandit_learner(normalize_returns=False, reward_clip=clip)
        with torch.no_grad():  # V = 0, so the value loss is the mean squared target
            learner.training.policy.model.critic.weight.zero_()
            learner.training.policy.model.critic.bias.zero_()
        batch = bandit_batch(learner, torch.Generator().manual_seed(0))
        batch["rewards"] = batch["rewards"] * 4.0  # rewards 0 or 4, one-step episodes
        batch["values"].zero_()
        rewarded = float((batch["rewards"] > 0).float().mean())
        assert 0.1 < rewarded < 0.9
        # on-policy one-step episodes: each target is the clipped reward
        expected = rewarded * min(4.0, clip) ** 2
        assert learner.train(batch)["value_loss"] == pytest.approx(expected, rel=1e-3)


def test_minibatches_in_buffer_order_without_shuffling():
    from tests.components.learning.test_learner import bandit_learner

    training = bandit_learner().training
    ordered = training.minibatches(8, 4, shuffle=False)
    assert [m.tolist() for m in ordered] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    shuffled = torch.cat(training.minibatches(64, 4, shuffle=True)).tolist()
    assert sorted(shuffled) == list(range(64)) and shuffled != list(range(64))


def test_mostly_invalid_batches_are_reported(caplog: pytest.LogCaptureFixture):
    from tests.components.learning.test_learner import bandit_batch, bandit_learner

    learner = bandit_learner()
    batch = bandit_batch(learner, torch.Generator().manual_seed(0))
    batch["versions"][:6] -= 1000  # 6 of 8 trajectories lag past max_policy_lag
    result = learner.train(batch)
    assert result["valid_fraction"] == pytest.approx(0.25)
    with caplog.at_level(logging.WARNING):
        learner._report(result)
    assert [r.getMessage()[:44] for r in caplog.records if r.levelno == logging.WARNING] == [
        "learner: only 25% of a batch's steps were va"]


def test_kl_penalty_is_the_kl_to_the_behaviour_distribution():
    """kl_loss_coeff adds c * E[KL(pi || mu)], mu rebuilt from the stored parameters."""
    from sfbus_components.algo import appo_loss
    from sfbus_components.models import ModelConfig
    from sfbus_components.models.actor_critic import ActorCritic
    from tests.components.algo.test_ppo import make_batch

    torch.manual_seed(0)
    net = ActorCritic({"obs": ((4,), "float32")}, (3, 2), None,
                      ModelConfig(core="none", mlp_layers=(8,)))
    batch = make_batch(net)
    behaviour = batch["action_params"] + torch.randn(batch["action_params"].shape)
    batch["action_params"] = behaviour
    plain = AppoConfig(normalize_returns=False)
    loss0, stats0 = appo_loss(net, batch, plain)
    loss1, _ = appo_loss(net, batch, replace(plain, kl_loss_coeff=0.5))
    with torch.no_grad():  # the KL written out per head from the softmaxes
        dist, _ = net.forward_sequence(batch["obs"], batch["rnn"],
                                       torch.nn.functional.pad(batch["dones"], (0, 1)))
        logits = dist[:, :-1].logits
        kl = torch.zeros(logits.shape[:2])
        for lo, hi in ((0, 3), (3, 5)):
            p = torch.softmax(logits[..., lo:hi], -1)
            q = torch.softmax(behaviour[..., lo:hi], -1)
            kl += (p * (p.log() - q.log())).sum(-1)
    assert float(stats0["kl"]) == pytest.approx(float(kl.mean()), rel=1e-4)
    assert float((loss1 - loss0).detach()) == pytest.approx(0.5 * float(kl.mean()), rel=1e-4)
    assert float(stats0["kl"]) > 0.05


def test_gaussian_parameters_round_trip():
    mean, log_std = torch.randn(3, 2), torch.randn(2)
    dist = ActionDistribution(mean=mean, log_std=log_std)
    again = ActionDistribution.from_params(dist.params, None)
    torch.testing.assert_close(again.mean, dist.mean)
    torch.testing.assert_close(again.log_std, dist.log_std)
    assert float(dist.kl(again).abs().max()) < 1e-6


def test_recurrence_runs_pieces_from_the_stored_states():
    """With the true states stored, pieces of `recurrence` steps give the whole-rollout loss
    exactly; with other stored states, the pieces start from those (truncated BPTT)."""
    from sfbus_components.algo import appo_loss
    from sfbus_components.models import ModelConfig
    from sfbus_components.models.actor_critic import ActorCritic
    from tests.components.algo.test_ppo import make_batch

    torch.manual_seed(0)
    net = ActorCritic({"obs": ((4,), "float32")}, (3, 2), None,
                      ModelConfig(core="gru", core_size=8, mlp_layers=(8,)))
    batch = make_batch(net, steps=6)
    obs, dones, start = batch["obs"], batch["dones"], batch["rnn"]
    with torch.no_grad():  # the state entering every step, stepped by hand
        states, state = [], start
        for t in range(7):
            states.append(state)
            features = net.encoder({k: v[:, t] for k, v in obs.items()})
            _, state = net.core.step(features, state)
            if t < 6:
                state = state * (1 - dones[:, t : t + 1])
        stored = torch.stack(states, dim=1)
    cfg = AppoConfig(normalize_returns=False)
    whole, stats = appo_loss(net, batch, cfg)
    for piece in (2, 3):
        pieces, pieces_stats = appo_loss(net, {**batch, "rnn": stored},
                                         replace(cfg, recurrence=piece))
        assert float(pieces.detach()) == pytest.approx(float(whole.detach()), rel=1e-5)
        assert float(pieces_stats["value_loss"]) == pytest.approx(float(stats["value_loss"]),
                                                                  rel=1e-5)
    stale = stored.clone()
    stale[:, 3] += 1.0  # a piece of 3 starts at step 3 from this state
    moved, _ = appo_loss(net, {**batch, "rnn": stale}, replace(cfg, recurrence=3))
    assert abs(float(moved.detach()) - float(whole.detach())) > 1e-4
    unmoved, _ = appo_loss(net, {**batch, "rnn": stale}, replace(cfg, recurrence=2))
    assert float(unmoved.detach()) == pytest.approx(float(whole.detach()), rel=1e-5)  # skips t=3


def test_recurrence_must_divide_the_rollout():
    from sfbus_components.datapath.settings import DataPathParams
    from sfbus_components.learning.learner import Learner

    params = Learner.Params(appo=AppoConfig(recurrence=5))
    with pytest.raises(ValueError, match=r"appo.recurrence \(5\) must divide the rollout \(32\)"):
        params.check_data_path(DataPathParams(env="gym:CartPole-v1", rollout=32))
    params.check_data_path(DataPathParams(env="gym:CartPole-v1", rollout=35, batch_size=35 * 64))


def test_linear_decay_without_max_frames_is_refused_before_anything_starts(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[3]
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(root / "topologies" / "cartpole.yaml"),
         "--set", "appo.lr_schedule=linear_decay", "--max-seconds", "30",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "actor 'learner': appo.lr_schedule linear_decay decays the rate over the run's " \
           "--max-frames" in done.stderr
    assert not (tmp_path / "run").exists()
