"""Hybrid actions: categorical heads and a Gaussian Box in one action, from the distribution's
formulas (checked against torch.distributions) to the gym adapter and a short real run."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import Categorical, Normal, kl_divergence

from sfbus_components.algo import AppoConfig, appo_loss
from sfbus_components.envs import ActionBox, EnvSpec, ObsField
from sfbus_components.envs.action_bounds import ActionMap
from sfbus_components.envs.gym.adapter import GymEnv
from sfbus_components.models import ActorCritic
from sfbus_components.models.config import ModelConfig
from sfbus_components.models.distributions import ActionDistribution, HybridDistribution
from tests.components.envs.hybrid_envs import PickAndSet
from tests.short_runs import mean_rewards

HEADS = (3, 2)
DIM = 2


def random_hybrid(gen: torch.Generator, batch: int = 7) -> tuple[torch.Tensor, ...]:
    """Logits `[batch, 5]`, mean and log-std `[batch, 2]`."""
    return (torch.randn(batch, sum(HEADS), generator=gen) * 2,
            torch.randn(batch, DIM, generator=gen),
            torch.randn(batch, DIM, generator=gen) * 0.5)


def hybrid(logits: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> HybridDistribution:
    return HybridDistribution(ActionDistribution(logits=logits, action_heads=HEADS),
                              ActionDistribution(mean=mean, log_std=log_std))


def reference_parts(logits: torch.Tensor, mean: torch.Tensor,
                    log_std: torch.Tensor) -> tuple[list[Categorical], Normal]:
    heads = [Categorical(logits=part) for part in logits.split(list(HEADS), dim=-1)]
    return heads, Normal(mean, log_std.exp())


def test_log_prob_entropy_and_kl_are_the_sums_of_the_parts() -> None:
    gen = torch.Generator().manual_seed(0)
    p_params, q_params = random_hybrid(gen), random_hybrid(gen)
    p, q = hybrid(*p_params), hybrid(*q_params)
    p_heads, p_box = reference_parts(*p_params)
    q_heads, q_box = reference_parts(*q_params)
    actions = p.sample(gen)
    assert actions.dtype == torch.float32 and actions.shape == (7, len(HEADS) + DIM)
    expected_log_prob = (sum(h.log_prob(actions[:, i].long()) for i, h in enumerate(p_heads))
                         + p_box.log_prob(actions[:, len(HEADS):]).sum(-1))
    torch.testing.assert_close(p.log_prob(actions), expected_log_prob)
    torch.testing.assert_close(p.entropy(), sum(h.entropy() for h in p_heads)
                               + p_box.entropy().sum(-1))
    expected_kl = (sum(kl_divergence(a, b) for a, b in zip(p_heads, q_heads, strict=True))
                   + kl_divergence(p_box, q_box).sum(-1))
    torch.testing.assert_close(p.kl(q), expected_kl)


def test_params_round_trip_and_slicing() -> None:
    gen = torch.Generator().manual_seed(1)
    logits, mean, log_std = random_hybrid(gen)
    dist = hybrid(logits, mean, log_std)
    params = dist.params
    assert params.shape == (7, sum(HEADS) + 2 * DIM)
    torch.testing.assert_close(params, torch.cat([logits, mean, log_std], dim=-1))
    back = ActionDistribution.from_params(params, HEADS, DIM)
    assert isinstance(back, HybridDistribution)
    torch.testing.assert_close(back.params, params)
    actions = dist.sample(gen)
    torch.testing.assert_close(back.log_prob(actions), dist.log_prob(actions))
    torch.testing.assert_close(dist[2:4].log_prob(actions[2:4]), dist.log_prob(actions)[2:4])
    # the categorical-only and Gaussian-only readings of params stay as they were
    assert ActionDistribution.from_params(logits, HEADS).is_categorical
    assert not ActionDistribution.from_params(torch.cat([mean, log_std], -1), None,
                                              DIM).is_categorical


def test_sample_and_mode() -> None:
    gen = torch.Generator().manual_seed(2)
    logits, mean, log_std = random_hybrid(gen, batch=4)
    dist = hybrid(logits, mean, log_std.clamp(max=-3.0))
    mode = dist.mode()
    expected = torch.cat([torch.stack([part.argmax(-1) for part in logits.split(list(HEADS), -1)],
                                      -1).float(), mean], -1)
    torch.testing.assert_close(mode, expected)
    draws = torch.stack([dist.sample(gen) for _ in range(2000)])
    heads = draws[..., :len(HEADS)]
    assert torch.equal(heads, heads.round()) and heads.min() >= 0
    assert (heads < torch.tensor(HEADS, dtype=heads.dtype)).all()
    torch.testing.assert_close(draws[..., len(HEADS):].mean(0), mean, atol=0.01, rtol=0)
    with pytest.raises(ValueError, match="categorical actions only"):
        dist.symmetric_kl_with_uniform()


def test_an_action_mask_applies_to_the_discrete_part_only() -> None:
    gen = torch.Generator().manual_seed(3)
    logits, mean, log_std = random_hybrid(gen, batch=2)
    mask = torch.tensor([[1, 0, 1, 0, 1], [0, 1, 0, 1, 1]], dtype=torch.int8)
    dist = HybridDistribution(ActionDistribution(logits=logits, action_heads=HEADS,
                                                 action_mask=mask),
                              ActionDistribution(mean=mean, log_std=log_std))
    draws = torch.stack([dist.sample(gen) for _ in range(3000)]).long()
    allowed = [{0: {0, 2}, 1: {1}}, {0: {1}, 1: {0, 1}}]
    for row in range(2):
        for head in range(2):
            assert set(draws[:, row, head].tolist()) == allowed[row][head]
    # the Box part's log-probability is the unmasked Gaussian's
    actions = dist.sample(gen)
    box = Normal(mean, log_std.exp()).log_prob(actions[:, 2:].float()).sum(-1)
    heads = dist.categorical.log_prob(actions[:, :2])
    torch.testing.assert_close(dist.log_prob(actions), heads + box)


def test_the_spec_of_a_hybrid_action() -> None:
    spec = EnvSpec({"obs": ObsField((4,), "float32")}, action_heads=HEADS,
                   action_box=ActionBox((-1.0,) * 2, (1.0,) * 2, (2,)))
    assert spec.is_hybrid and spec.is_continuous and spec.box_size == 2
    assert spec.action_shape == (4,) and spec.action_dtype == "float32"
    assert spec.action_params_size == 5 + 4
    actions, log_probs = spec.random_actions(np.random.default_rng(0), 5000)
    assert actions.shape == (5000, 4) and actions.dtype == np.float32
    heads = actions[:, :2]
    assert (heads == heads.round()).all() and set(np.unique(heads[:, 0])) == {0.0, 1.0, 2.0}
    expected = (-np.log(6.0) - 0.5 * np.square(actions[:, 2:]).sum(1) - np.log(2 * np.pi))
    np.testing.assert_allclose(log_probs, expected, rtol=1e-5)
    # the categorical-only and continuous-only specs are as before
    assert EnvSpec({"obs": ObsField((4,), "float32")}, action_heads=HEADS).action_dtype == "int64"
    with pytest.raises(ValueError, match="action_heads, an action_box or both"):
        EnvSpec({"obs": ObsField((4,), "float32")})


def test_action_bounds_map_only_the_box_part() -> None:
    spec = EnvSpec({"obs": ObsField((4,), "float32")}, action_heads=(3,),
                   action_box=ActionBox((-1.0, 0.0), (1.0, 2.0), (2,)))
    actions = np.array([[2.0, 5.0, -3.0], [1.0, 0.5, 0.5]], np.float32)
    np.testing.assert_array_equal(ActionMap(spec, "clip")(actions),
                                  [[2.0, 1.0, 0.0], [1.0, 0.5, 0.5]])
    squashed = ActionMap(spec, "squash")(actions)
    np.testing.assert_allclose(squashed[:, 1:], [[np.tanh(5.0), np.tanh(-3.0) + 1.0],
                                                 [np.tanh(0.5), np.tanh(0.5) + 1.0]], atol=1e-6)
    np.testing.assert_array_equal(squashed[:, 0], actions[:, 0])
    assert actions[0, 1] == 5.0  # the sampled actions are left as they were


def test_the_gym_adapter_against_the_raw_tuple_env() -> None:
    ours, raw = GymEnv(PickAndSet(), seed=5), PickAndSet()
    spec = ours.spec
    assert spec.action_heads == (3,) and spec.action_box == ActionBox((-1.0,), (1.0,), (1,))
    obs = spec.empty_obs()
    ours.reset_into(obs)
    raw_obs, _ = raw.reset(seed=5)
    rng = np.random.default_rng(0)
    total = 0.0
    for _ in range(40):
        actions, _ = spec.random_actions(rng, 1)
        reward, _, truncated, _ = ours.step_into(actions, obs)
        # the spec's order is the heads, then the Box; the env's Tuple is (Box, Discrete)
        raw_obs, raw_reward, _, raw_truncated, _ = raw.step(
            (actions[0, 1:].copy(), int(actions[0, 0])))
        if raw_truncated:
            raw_obs, _ = raw.reset()
        np.testing.assert_array_equal(obs["obs"][0], raw_obs)
        assert reward[0] == np.float32(raw_reward) and truncated[0] == raw_truncated
        total += raw_reward
    assert total > 0.0


class _ActionSpaceOnly(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, action_space: spaces.Space) -> None:
        self.action_space = action_space


@pytest.mark.parametrize(("space", "message"), [
    (spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (1,)), spaces.Box(-1, 1, (1,)))),
     "item 2 is a second Box"),
    (spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3))), "item 1 is MultiBinary"),
    (spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))), "at least one Discrete space and "
                                                             "one Box"),
    (spaces.Tuple((spaces.Box(-1, 1, (1,)),)), "at least one Discrete space and one Box"),
])
def test_other_tuples_are_refused_with_the_item_named(space: spaces.Space, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        GymEnv(_ActionSpaceOnly(space))


def test_the_model_acts_and_the_learner_loss_trains_both_heads() -> None:
    torch.manual_seed(0)
    model = ActorCritic({"obs": ((4,), "float32")}, action_heads=HEADS, action_dim=DIM,
                        cfg=ModelConfig(core="gru", core_size=8, mlp_layers=(16,)))
    b, t = 6, 3
    obs = {"obs": torch.randn(b, t + 1, 4)}
    out = model.forward_step({"obs": obs["obs"][:, 0]}, model.initial_state(b))
    assert out.actions.shape == (b, len(HEADS) + DIM) and out.actions.dtype == torch.float32
    assert out.action_logits.shape == (b, sum(HEADS) + 2 * DIM)
    behaviour = ActionDistribution.from_params(out.action_logits, HEADS, DIM)
    torch.testing.assert_close(behaviour.log_prob(out.actions), out.log_prob)
    dist, _ = model.forward_sequence(obs, model.initial_state(b), torch.zeros(b, t + 1))
    assert isinstance(dist, HybridDistribution)
    actions = dist.sample()[:, :t]
    # mu a little off pi, so the KL term is not zero
    params = dist.params[:, :t].detach() + 0.1 * torch.randn(b, t, sum(HEADS) + 2 * DIM)
    batch = {"obs": obs, "rnn": model.initial_state(b), "actions": actions,
             "log_probs": ActionDistribution.from_params(params, HEADS, DIM).log_prob(actions),
             "action_params": params, "values": torch.zeros(b, t),
             "rewards": torch.randn(b, t), "dones": torch.zeros(b, t),
             "time_outs": torch.zeros(b, t)}
    loss, stats = appo_loss(model, batch, AppoConfig(kl_loss_coeff=0.5, entropy_coeff=0.01,
                                                     normalize_returns=False))
    loss.backward()
    expected_kl = dist[:, :t].kl(ActionDistribution.from_params(params, HEADS, DIM)).mean()
    torch.testing.assert_close(stats["kl"], expected_kl.detach())
    assert model.actor.weight.grad.abs().sum() > 0
    assert model.actor_box.linear.weight.grad.abs().sum() > 0
    assert model.actor_box.log_std.grad.abs().sum() > 0
    # the learner's pass in pieces (appo.recurrence) rebuilds the hybrid from its parameters
    pieces = {**batch, "obs": {"obs": torch.randn(b, 4 + 1, 4)},
              "rnn": torch.zeros(b, 4 + 1, model.state_size),
              **{k: torch.cat([v, v[:, :1]], 1) for k, v in batch.items()
                 if k not in ("obs", "rnn")}}
    loss, stats = appo_loss(model, pieces, AppoConfig(recurrence=2, normalize_returns=False))
    assert torch.isfinite(loss) and stats["kl"] > 0


@pytest.mark.multiprocess
def test_a_short_hybrid_run_learns(tmp_path: Path) -> None:
    """Random play scores about 5.6 of 16 per episode; the right choice alone (with the Box
    random) about 11, the Box alone about 10.7; the run must pass 12 within 30k frames (about
    20 s here; it reaches ~12.7 there and ~12.9 at 60k)."""
    rewards = mean_rewards(tmp_path / "run", "tests.components.envs.hybrid_envs:make_pick_and_set",
                           30000, "appo.lr=0.003", timeout=150)
    assert rewards and rewards[-1] > 12.0, rewards


def test_random_play_scores_what_the_run_test_says() -> None:
    """The bar of the run test means something: random play is far below it."""
    env = GymEnv(PickAndSet(), seed=0)
    obs = env.spec.empty_obs()
    env.reset_into(obs)
    rng = np.random.default_rng(1)
    returns = []
    while len(returns) < 500:
        actions, _ = env.spec.random_actions(rng, 1)
        info = env.step_into(actions, obs)[3][0]
        if "episode_return" in info:
            returns.append(info["episode_return"])
    assert 5.0 < np.mean(returns) < 6.3
