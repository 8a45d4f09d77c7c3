"""V-trace and GAE against references written straight from their definitions (sums, not the
backward recursions the library uses)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sfbus_components.algo.gae import gae
from sfbus_components.algo.vtrace import vtrace


def vtrace_reference(values, bootstrap, rewards, dones, log_rhos, gamma, rho_bar, c_bar):
    """IMPALA eq. (1) as a double sum, with gamma^{k-t} generalized to the product of per-step
    discounts (zero after an episode end)."""
    batch, steps = values.shape
    ratios = np.exp(log_rhos)
    rhos, cs = np.minimum(rho_bar, ratios), np.minimum(c_bar, ratios)
    disc = gamma * (1.0 - dones)
    v_ext = np.concatenate([values, bootstrap[:, None]], axis=1)  # V(x_0..x_T)
    vs = np.zeros_like(values)
    for b in range(batch):
        for t in range(steps):
            total = 0.0
            for k in range(t, steps):
                weight = 1.0  # prod_{i=t}^{k-1} discount_i c_i
                for i in range(t, k):
                    weight *= disc[b, i] * cs[b, i]
                delta = rhos[b, k] * (rewards[b, k] + disc[b, k] * v_ext[b, k + 1] - v_ext[b, k])
                total += weight * delta
            vs[b, t] = values[b, t] + total
    vs_ext = np.concatenate([vs, bootstrap[:, None]], axis=1)
    adv = rhos * (rewards + disc * vs_ext[:, 1:] - values)
    return vs, adv


def random_rollout(rng, batch, steps, done_prob, rho_scale):
    """Random float64 arrays for one test case."""
    return (
        rng.normal(size=(batch, steps)),
        rng.normal(size=batch),
        rng.normal(size=(batch, steps)),
        (rng.random((batch, steps)) < done_prob).astype(np.float64),
        rng.normal(scale=rho_scale, size=(batch, steps)),
    )


def as_torch(*arrays):
    """Tensors (vtrace and gae compute in float32)."""
    return [torch.from_numpy(a) for a in arrays]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    steps=st.integers(1, 12),
    gamma=st.sampled_from([0.0, 0.9, 0.99, 1.0]),
    rho_bar=st.sampled_from([0.5, 1.0, 2.0]),
    c_bar=st.sampled_from([0.5, 1.0, 1.5]),
)
def test_vtrace_matches_definition(seed, steps, gamma, rho_bar, c_bar):
    rng = np.random.default_rng(seed)
    # log_rhos with scale 3: ratios from ~e^-9 to ~e^9, so truncation bites in both directions
    arrays = random_rollout(rng, 3, steps, done_prob=0.25, rho_scale=3.0)
    vs, adv = vtrace(*as_torch(*arrays), gamma=gamma, rho_bar=rho_bar, c_bar=c_bar)
    ref_vs, ref_adv = vtrace_reference(*arrays, gamma, rho_bar, c_bar)
    np.testing.assert_allclose(vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-5, atol=1e-5)


def test_vtrace_truncation_and_episode_end_matter():
    """Guard against a reference that agrees for the wrong reason: the inputs are such that
    ignoring dones or the truncation gives a different answer."""
    rng = np.random.default_rng(0)
    values, boot, rewards, dones, log_rhos = random_rollout(rng, 2, 8, 0.3, 3.0)
    dones[:, 3] = 1.0
    vs, _ = vtrace(*as_torch(values, boot, rewards, dones, log_rhos), gamma=0.9)
    no_dones = vtrace_reference(values, boot, rewards, 0 * dones, log_rhos, 0.9, 1.0, 1.0)[0]
    untruncated = vtrace_reference(values, boot, rewards, dones, log_rhos, 0.9, 1e9, 1e9)[0]
    assert not np.allclose(vs.numpy(), no_dones)
    assert not np.allclose(vs.numpy(), untruncated)


def test_on_policy_vtrace_is_bootstrapped_n_step_return():
    rng = np.random.default_rng(1)
    batch, steps, gamma = 4, 32, 0.99
    values, boot, rewards, dones, _ = random_rollout(rng, batch, steps, 0.1, 1.0)
    vs, adv = vtrace(*as_torch(values, boot, rewards, dones, np.zeros_like(values)), gamma=gamma)
    # G_t = sum of discounted rewards to the episode end or to T, plus gamma^{T-t} V(x_T) if
    # the episode did not end
    expected = np.zeros_like(values)
    for b in range(batch):
        for t in range(steps):
            ret, discount = 0.0, 1.0
            for k in range(t, steps):
                ret += discount * rewards[b, k]
                if dones[b, k]:
                    discount = 0.0
                    break
                discount *= gamma
            expected[b, t] = ret + discount * boot[b]
    np.testing.assert_allclose(vs.numpy(), expected, rtol=1e-5, atol=1e-5)
    # and the advantage is the one-step TD error on vs: r_t + gamma vs_{t+1} - V(x_t)
    vs_next = np.concatenate([expected[:, 1:], boot[:, None]], axis=1)
    np.testing.assert_allclose(
        adv.numpy(), rewards + gamma * (1 - dones) * vs_next - values, rtol=1e-5, atol=1e-5
    )


def gae_reference(values, bootstrap, rewards, dones, gamma, lam):
    """A_t = sum_l (prod of gamma*lambda*(1-d) over the l steps before) delta_{t+l}."""
    v_next = np.concatenate([values[:, 1:], bootstrap[:, None]], axis=1)
    deltas = rewards + gamma * (1 - dones) * v_next - values
    adv = np.zeros_like(values)
    batch, steps = values.shape
    for b in range(batch):
        for t in range(steps):
            weight = 1.0
            for k in range(t, steps):
                adv[b, t] += weight * deltas[b, k]
                weight *= gamma * lam * (1 - dones[b, k])
    return adv + values, adv


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_matches_definition(lam):
    rng = np.random.default_rng(2)
    values, boot, rewards, dones, _ = random_rollout(rng, 3, 16, 0.2, 1.0)
    returns, adv = gae(*as_torch(values, boot, rewards, dones), gamma=0.97, lam=lam)
    ref_returns, ref_adv = gae_reference(values, boot, rewards, dones, 0.97, lam)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns.numpy(), ref_returns, rtol=1e-5, atol=1e-5)


def test_gae_lambda_one_equals_on_policy_vtrace():
    rng = np.random.default_rng(3)
    values, boot, rewards, dones, _ = random_rollout(rng, 3, 16, 0.2, 1.0)
    returns, _ = gae(*as_torch(values, boot, rewards, dones), gamma=0.95, lam=1.0)
    zeros = np.zeros_like(values)
    vs, _ = vtrace(*as_torch(values, boot, rewards, dones, zeros), gamma=0.95)
    np.testing.assert_allclose(returns.numpy(), vs.numpy(), rtol=1e-5, atol=1e-5)
