"""The APPO loss: V-trace (or GAE) targets from the current model, then PPO's three losses."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sfbus_components.algo.gae import gae
from sfbus_components.algo.ppo import (
    AppoConfig,
    entropy_loss,
    impala_policy_loss,
    masked_mean,
    masked_std_mean,
    normalize_advantages,
    policy_loss,
    symmetric_kl_loss,
    value_loss,
)
from sfbus_components.algo.trajectories import STEP_KEYS, Trajectories
from sfbus_components.algo.vtrace import vtrace
from sfbus_components.models.actor_critic import ActorCritic
from sfbus_components.models.distributions import ActionDistribution
from sfbus_components.models.normalizers import ReturnsNormalizer


def appo_loss(
    model: ActorCritic,
    batch: Trajectories,
    cfg: AppoConfig,
    returns_normalizer: ReturnsNormalizer | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Total APPO loss and its figures for one minibatch of `B` trajectories: detached 0-dim
    tensors under `TrainingStats` names, and `policy_lag_mean` / `_max` where versions are given.

    `batch` holds the fields of :class:`~sfbus_components.algo.trajectories.Trajectories`
    (time is axis 1; `T` = the obs' time length - 1, or the whole of it where GAE's `targets`
    and `advantages` are given without step T's obs). V(x_T), from step T's observation, comes
    from the *current* model; `obs` should already be normalized (`ObsNormalizer`, once per
    batch). Steps of another policy (`valids`) or lagging more than `cfg.max_policy_lag`
    (`versions` with `learner_version`) are masked out of every loss. Without GAE's `targets`
    and `advantages` (V-trace off), GAE is computed here the same way, V(x_T) from this forward
    pass.
    """
    obs, num_steps, step, dones = _steps(batch)
    valids, policy_lag = _valid_steps(step, batch, cfg)

    # forward pass over T + 1 steps (step T gives V(x_T)), or T where GAE's targets hold V(x_T)
    dist_all, values_all = _forward(model, obs, batch["rnn"], dones, cfg)
    dist = dist_all[:, :num_steps]
    values = values_all[:, :num_steps]
    bootstrap = _bootstrap(values_all, num_steps, cfg)
    log_prob_new = dist.log_prob(step["actions"])
    log_prob_old = step["log_probs"].float()

    with torch.no_grad():
        # log rho_t = log pi(a_t|x_t) - log mu(a_t|x_t)
        targets, advantages = _targets(step, values.detach(), bootstrap,
                                       log_prob_new.detach() - log_prob_old, valids, cfg,
                                       returns_normalizer)
        adv_std, adv_mean = masked_std_mean(advantages, valids)
        if cfg.normalize_advantage:
            advantages = normalize_advantages(advantages, valids)

    # policy loss: PPO clipped surrogate, or (clipping off) an importance-weighted gradient
    if cfg.with_ppo_clipping:
        loss_pi = policy_loss(log_prob_new, log_prob_old, advantages, cfg.ppo_clip_ratio, valids)
    elif cfg.with_vtrace:
        loss_pi = impala_policy_loss(log_prob_new, advantages, valids)
    else:
        loss_pi = policy_loss(log_prob_new, log_prob_old, advantages, None, valids)
    # critic loss, clipped around the behavior-time values
    clip_value = cfg.ppo_clip_value if cfg.ppo_clip_value > 0 else None
    loss_v = value_loss(values, step["values"].float(), targets, clip_value, valids)
    # exploration: the entropy bonus, or the symmetric KL to the uniform policy
    entropy = dist.entropy()
    loss_explore = (symmetric_kl_loss(dist.symmetric_kl_with_uniform(), valids)
                    if cfg.exploration_loss == "symmetric_kl" else entropy_loss(entropy, valids))
    # KL(pi || mu) against the behaviour distribution: the penalty, and the figure the
    # KL-adaptive learning-rate schedules read
    behaviour = ActionDistribution.from_params(step["action_params"].float(), model.action_heads,
                                               model.action_dim)
    with torch.set_grad_enabled(cfg.kl_loss_coeff > 0):  # only a figure without the penalty
        kl_steps = dist.kl(behaviour)
        kl_old = masked_mean(kl_steps, valids)
    # total: L = L_pi + c_v L_V + c_H L_H (+ c_KL KL)
    loss = loss_pi + cfg.value_loss_coeff * loss_v + cfg.entropy_coeff * loss_explore
    if cfg.kl_loss_coeff > 0:
        loss = loss + cfg.kl_loss_coeff * kl_old

    with torch.no_grad():
        # The figures, under TrainingStats' names (sfbus_components.datapath.messages); the
        # learner averages each over a batch's minibatches (*_min, *_max: their min, max).
        stats = {"loss": loss.detach(), "policy_loss": loss_pi.detach(),
                 "value_loss": loss_v.detach(), "exploration_loss": loss_explore.detach(),
                 "entropy": masked_mean(entropy.detach(), valids), "kl": kl_old.detach(),
                 "kl_max": (kl_steps.detach() * valids).max(), "adv_mean": adv_mean,
                 "adv_std": adv_std,
                 **_step_figures(log_prob_new.detach() - log_prob_old, values.detach(),
                                 step["values"].float(), targets, valids, cfg)}
        if policy_lag is not None:
            stats["policy_lag_mean"] = policy_lag.mean()
            stats["policy_lag_max"] = policy_lag.max()
    return loss, stats



def _step_figures(log_ratio: Tensor, values: Tensor, behaviour_values: Tensor, targets: Tensor,
                  valids: Tensor, cfg: AppoConfig) -> dict[str, Tensor]:
    """The importance ratios' and the critic's figures over a minibatch's valid steps; 0
    without one, as the masked means (the maxima of non-negative figures as masked products)."""
    ratio = torch.exp(log_ratio)
    low, high = cfg.clip_range
    value_delta = (values - behaviour_values).abs()
    # extremes over the valid steps without selecting them (no wait for a GPU); 0 without one
    any_valid = valids.any()
    return {
        "clip_fraction": masked_mean(((ratio < low) | (ratio > high)).float(), valids),
        "ratio_mean": masked_mean(ratio, valids),
        "ratio_deviation": masked_mean((1.0 - ratio).abs(), valids),
        "ratio_min": torch.where(any_valid, torch.where(valids, ratio, math.inf).min(), 0.0),
        "ratio_max": torch.where(any_valid, torch.where(valids, ratio, -math.inf).max(), 0.0),
        "value_mean": masked_mean(values, valids),
        "value_delta": masked_mean(value_delta, valids),
        "value_delta_max": (value_delta * valids).max(),
        "target_mean": masked_mean(targets, valids),
        "valid_fraction": valids.float().mean(),
    }

@torch.no_grad()
def gae_targets(
    model: ActorCritic,
    batch: Trajectories,
    cfg: AppoConfig,
    returns_normalizer: ReturnsNormalizer | None = None,
    bootstrap_obs: dict[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Value targets (normalized where returns are) and GAE advantages `[B, T]` of a whole batch.

    Computed once before the batch's epochs, as PPO and Sample Factory do: from the
    behaviour-time `values` and the current model's V(x_T), run from the stored state entering
    step T (`rnn [B, T + 1, S]`; a model without state takes any). `appo_loss` trains on
    them as the batch's `targets` and `advantages`. Recomputed from the current critic at every
    minibatch instead, later epochs would normalize what is left of the advantages once the
    critic has fitted these very returns. The returns statistics take the batch once.
    `bootstrap_obs` (`[B, 1, ...]`): step T's obs, where the batch's obs hold steps 0..T-1 only
    (the loss then runs no step T: its steps flatten into the encoder's rows without a copy)."""
    obs, num_steps, step, dones = _steps(batch, bootstrap_apart=bootstrap_obs is not None)
    valids, _ = _valid_steps(step, batch, cfg)
    rnn_state = batch["rnn"]
    if rnn_state.dim() == 3:  # the state entering T is 0 after an episode's end at T - 1
        entering = rnn_state[:, num_steps] * (1.0 - dones[:, num_steps - 1 :].to(rnn_state.dtype))
    elif model.state_size == 0:
        entering = rnn_state
    else:
        raise ValueError("gae_targets needs the state entering each step: rnn [B, T + 1, S]")
    last = (bootstrap_obs if bootstrap_obs is not None
            else {k: v[:, num_steps:] for k, v in obs.items()})
    _, bootstrap = model.forward_sequence(last, entering, torch.zeros_like(dones[:, :1]))
    return _gae_targets(step, bootstrap[:, 0], dones, valids, cfg, returns_normalizer)


def _bootstrap(values_all: Tensor, num_steps: int, cfg: AppoConfig) -> Tensor | None:
    """V(x_T) from the pass, detached; None where the obs came without step T (GAE's targets
    hold it), which V-trace, needing the current model's, refuses."""
    if values_all.shape[1] > num_steps:
        return values_all[:, num_steps].detach()
    if cfg.with_vtrace:
        raise ValueError("V-trace needs V(x_T): obs of T + 1 steps")
    return None


def _forward(model: ActorCritic, obs: dict[str, Tensor], rnn: Tensor, dones: Tensor,
             cfg: AppoConfig) -> tuple[ActionDistribution, Tensor]:
    """The current model over the obs' steps (``T + 1``, or ``T`` without the bootstrap step):
    in pieces of ``cfg.recurrence`` steps where the state entering every step is given, else
    whole from the state entering step 0."""
    if rnn.dim() == 3 and 0 < cfg.recurrence < dones.shape[1]:
        return _forward_in_pieces(model, obs, rnn, dones, cfg.recurrence)
    extra = next(iter(obs.values())).shape[1] - dones.shape[1]
    return model.forward_sequence(obs, rnn[:, 0] if rnn.dim() == 3 else rnn,
                                  torch.nn.functional.pad(dones, (0, extra)))


def _targets(step: dict[str, Tensor], values: Tensor, bootstrap: Tensor | None, log_rhos: Tensor,
             valids: Tensor, cfg: AppoConfig, returns_normalizer: ReturnsNormalizer | None,
             ) -> tuple[Tensor, Tensor]:
    """The (normalized) value targets and advantages ``[B, T]`` of a minibatch from the current
    model's ``values``, V(x_T) ``bootstrap`` and ``log_rhos``: V-trace's, or GAE's (the batch's
    own where ``gae_targets`` gave them)."""
    dones = step["dones"].float()
    if cfg.with_vtrace:
        # V-trace needs the current policy's ratios, so its targets follow each minibatch
        values_ret, bootstrap_ret = _return_space(values, bootstrap, cfg, returns_normalizer)
        targets, advantages = vtrace(
            values_ret, bootstrap_ret, _rewards(step, values_ret, dones, cfg), dones,
            log_rhos, cfg.gamma, cfg.vtrace_rho_bar, cfg.vtrace_c_bar,
        )  # fmt: skip
        return _normalized_targets(targets, valids, cfg, returns_normalizer), advantages
    if "advantages" in step:  # computed once for the whole batch: gae_targets
        return step["targets"], step["advantages"]
    return _gae_targets(step, bootstrap, dones, valids, cfg, returns_normalizer)


def _gae_targets(step: dict[str, Tensor], bootstrap: Tensor, dones: Tensor, valids: Tensor,
                 cfg: AppoConfig, returns_normalizer: ReturnsNormalizer | None,
                 ) -> tuple[Tensor, Tensor]:
    """GAE's (normalized targets, advantages) from the behaviour-time values and ``bootstrap``
    V(x_T), both in the critic's (normalized) space."""
    values_ret, bootstrap_ret = _return_space(step["values"].float(), bootstrap, cfg,
                                              returns_normalizer)
    targets, advantages = gae(values_ret, bootstrap_ret, _rewards(step, values_ret, dones, cfg),
                              dones, cfg.gamma, cfg.gae_lambda)
    return _normalized_targets(targets, valids, cfg, returns_normalizer), advantages


def _steps(batch: Trajectories, bootstrap_apart: bool = False,
           ) -> tuple[dict[str, Tensor], int, dict[str, Tensor], Tensor]:
    """The batch's obs, its `T`, its per-step fields cut to `T` steps (views), and float
    dones. `T` is the obs' time length less step T's, unless that step comes apart
    (`bootstrap_apart`) or the advantages came without it (their length)."""
    obs = batch["obs"]
    length = next(iter(obs.values())).shape[1]
    num_steps = (length if bootstrap_apart else
                 batch["advantages"].shape[1] if "advantages" in batch else length - 1)
    step = {key: batch[key][:, :num_steps] for key in STEP_KEYS if key in batch}
    return obs, num_steps, step, step["dones"].float()


def _valid_steps(step: dict[str, Tensor], batch: Trajectories, cfg: AppoConfig,
                 ) -> tuple[Tensor, Tensor | None]:
    """The steps that train: the caller's `valids`, and a policy lag of at most
    `max_policy_lag`; and the lags (None without versions)."""
    valids = torch.ones_like(step["dones"], dtype=torch.bool)
    if "valids" in step:
        valids &= step["valids"].bool()
    policy_lag = None
    if "versions" in step and "learner_version" in batch:
        policy_lag = (batch["learner_version"] - step["versions"]).float()
        valids &= policy_lag <= cfg.max_policy_lag
    return valids, policy_lag


def _return_space(values: Tensor, bootstrap: Tensor, cfg: AppoConfig,
                  returns_normalizer: ReturnsNormalizer | None) -> tuple[Tensor, Tensor]:
    """The critic's values and V(x_T) in return space (denormalized where returns are)."""
    if not cfg.normalize_returns:
        return values, bootstrap
    if returns_normalizer is None:
        raise ValueError("cfg.normalize_returns needs a returns_normalizer")
    return returns_normalizer.denormalize(values), returns_normalizer.denormalize(bootstrap)


def _rewards(step: dict[str, Tensor], values_ret: Tensor, dones: Tensor,
             cfg: AppoConfig) -> Tensor:
    """The rewards the targets add up: with `value_bootstrap`, time-limit cuts bootstrapped."""
    if not cfg.value_bootstrap:
        return step["rewards"]
    if "time_outs" not in step:
        raise ValueError("cfg.value_bootstrap needs the batch's time_outs")
    return bootstrap_time_outs(step["rewards"], values_ret, dones, step["time_outs"], cfg.gamma)


def _normalized_targets(targets: Tensor, valids: Tensor, cfg: AppoConfig,
                        returns_normalizer: ReturnsNormalizer | None) -> Tensor:
    """``targets`` in the critic's space; in training the returns statistics take the valid,
    finite ones first."""
    if not cfg.normalize_returns:
        return targets
    assert returns_normalizer is not None  # _return_space refused its absence
    if returns_normalizer.training:
        seen = targets[valids]
        seen = seen[torch.isfinite(seen)]
        if seen.numel():
            returns_normalizer.update(seen)
    return returns_normalizer.normalize(targets)


def bootstrap_time_outs(rewards: Tensor, values: Tensor, dones: Tensor, time_outs: Tensor,
                        gamma: float) -> Tensor:
    """r_t + gamma * V(x_t) where step t ended its episode by a time limit, else r_t.

    V(x_{t+1}) is what the cut return would go on from, but x_{t+1} is not in the trajectory
    (the env was reset): V(x_t) stands in for it, as in Sample Factory (good where one step's
    reward is small beside the return). `values` in return space, `dones` float `[B, T]`."""
    return rewards + gamma * values * time_outs.to(values.dtype) * dones


def _forward_in_pieces(model: ActorCritic, obs: dict[str, Tensor], rnn: Tensor,
                       dones: Tensor, piece: int) -> tuple[ActionDistribution, Tensor]:
    """``forward_sequence`` over ``[B, T + 1]`` steps as ``T / piece`` pieces of ``piece`` steps
    plus the bootstrap step (where the obs have it), each from the stored state entering its
    first step (``rnn [B, T + 1, S]``, zeroed after an episode's end as the rollout worker
    does)."""
    batch, num_steps = dones.shape
    pieces = num_steps // piece
    entering = rnn.clone()
    entering[:, 1:] *= 1.0 - dones.unsqueeze(-1)  # the state entering t+1 after a done is 0
    body = {k: v[:, :num_steps].reshape(batch * pieces, piece, *v.shape[2:])
            for k, v in obs.items()}
    dist_body, values_body = model.forward_sequence(
        body, entering[:, :num_steps:piece].reshape(batch * pieces, -1),
        dones.reshape(batch * pieces, piece))
    if next(iter(obs.values())).shape[1] == num_steps:  # no bootstrap step
        return (ActionDistribution.from_params(dist_body.params.reshape(batch, num_steps, -1),
                                               model.action_heads, model.action_dim),
                values_body.reshape(batch, num_steps))
    last = {k: v[:, num_steps:] for k, v in obs.items()}
    dist_last, values_last = model.forward_sequence(last, entering[:, num_steps],
                                                    torch.zeros_like(dones[:, :1]))
    params = torch.cat([dist_body.params.reshape(batch, num_steps, -1), dist_last.params], 1)
    return (ActionDistribution.from_params(params, model.action_heads, model.action_dim),
            torch.cat([values_body.reshape(batch, num_steps), values_last], dim=1))
