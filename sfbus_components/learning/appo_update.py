"""One learner update: APPO epochs over a batch, on the learner's training state.

The learner's math, top to bottom: the batch enters the training device
(:meth:`TrainingState.to_device`, the one copy in), the observation statistics take the batch
and the observations are normalized, GAE's targets are computed once for the batch (V-trace's
follow each minibatch), then per minibatch the V-trace + PPO loss and one Adam step (skipped
where the loss or the gradient is not finite; in a distributed group the gradients are
averaged first), then the counters move on. The learner actor calls it on its training thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from sfbus_components.algo import appo_loss, gae_targets
from sfbus_components.algo.lr_schedule import LrSchedule
from sfbus_components.algo.trajectories import Trajectories
from sfbus_components.datapath.messages import TRAINING_FIGURES
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.envs import EnvSpec
from sfbus_components.learning.distributed import Peers
from sfbus_components.learning.faults import NumericsGuard
from sfbus_components.learning.learner_params import LearnerParams
from sfbus_components.learning.population_member import PopulationMember
from sfbus_components.learning.training_state import TrainingState
from sfbus_components.monitoring.memory import gpu_memory_mb, process_memory_mb

_IMAGE_STAT_STRIDE = 8


class AppoUpdate:
    """APPO epochs over one batch at a time, on ``training``; ``population`` says which steps
    count, ``numerics`` keeps and puts back the last good state; ``spec`` gives the env's
    frameskip and reward scale, ``data`` the run's T and whether observations are normalized.
    The learning rate follows ``appo.lr_schedule``."""

    def __init__(self, training: TrainingState, population: PopulationMember,
                 numerics: NumericsGuard, spec: EnvSpec, data: DataPathParams,
                 max_frames: int | None = None) -> None:
        self.training = training
        self.population = population
        self.numerics = numerics
        self.frameskip = spec.frameskip
        self.env_reward_scale = spec.reward_scale
        self.rollout = data.rollout
        self.normalize_input = data.model.normalize_input
        self.max_frames = max_frames
        """The run's --max-frames, which ``lr_schedule: linear_decay`` decays over."""

    def __call__(self, batch: Trajectories, params: LearnerParams,
                 peers: Peers | None) -> dict[str, Any]:
        """Train on ``batch`` (``BatchCopy``'s, on the host) with ``params``; bumps the
        version. The loss figures, lags and sample counts of the batch."""
        start = time.perf_counter()
        cfg, t = params.appo, self.training
        self.numerics.before_batch()  # keeps a copy of the last good state now and then
        # Counted, and the lags below taken, on the host copy: on a GPU, reading the device's
        # would wait for the upload and the preparation before the loss's kernels were queued.
        own_steps = self.population.valid_steps(batch)
        samples = int(own_steps.sum())
        data = self._prepare(t.to_device(batch), params)
        figures: list[dict[str, float]] = []
        norms: list[float] = []
        skipped = 0
        schedule = LrSchedule(cfg.lr_schedule, cfg.lr, cfg.lr_schedule_kl_threshold,
                              cfg.lr_adaptive_min, cfg.lr_adaptive_max, self.max_frames)
        batch_frames = samples * self.frameskip
        steps, done = cfg.num_epochs * cfg.num_batches_per_epoch, 0
        for _ in range(cfg.num_epochs):
            kls: list[float] = []
            for index in t.minibatches(len(own_steps), cfg.num_batches_per_epoch,
                                       cfg.shuffle_minibatches):
                loss_figures, grad_norm = self._sgd_step(
                    data if index is None else _select(data, index), params, peers)
                skipped += grad_norm is None
                self.numerics.after_step(grad_norm is not None)  # N bad: last good state
                figures += [loss_figures] if loss_figures is not None else []
                norms += [grad_norm] if grad_norm is not None else []
                done += 1
                if loss_figures is not None:
                    kls.append(loss_figures["kl"])
                    t.set_lr(schedule.after_minibatch(
                        t.lr, kls, t.env_frames + batch_frames * done / steps))
            if kls:
                t.set_lr(schedule.after_epoch(t.lr, kls))
        lag = (t.version - batch["versions"]).float()
        t.version += 1
        t.train_steps += 1
        t.samples += samples
        t.env_frames += samples * self.frameskip
        if peers is not None:
            peers.record_batch(t.version, samples, cfg.num_epochs)
        # appo_loss's figures of each minibatch: a batch reports their mean (*_min, *_max:
        # their smallest, largest); NaN where every step was skipped
        result: dict[str, Any] = {
            k: _reduce(k)([f[k] for f in figures]) for k in (figures[0] if figures else ())}
        result.update(self._running_figures(), memory=process_memory_mb(),
                      gpu_memory=gpu_memory_mb(t.device))
        own_lags = lag[own_steps]  # the steps of this policy, those lagging too much included
        low, median, p90 = (own_lags.quantile(torch.tensor([0.0, 0.5, 0.9])).tolist()
                            if own_lags.numel() else [math.nan] * 3)
        result.update(
            grad_norm=_mean(norms), skipped=skipped, samples=samples,
            valid_fraction=float((own_steps & (lag <= cfg.max_policy_lag)).float().mean()),
            lag_mean=float(own_lags.mean()) if samples else 0.0,
            lag_max=float(own_lags.max()) if samples else 0.0,
            lag_min=low, lag_p50=median, lag_p90=p90,
            trajectory_lags=_row_means(lag, own_steps),
            train_seconds=time.perf_counter() - start)
        return result

    def _prepare(self, batch: Trajectories, params: LearnerParams) -> Trajectories:
        """``batch`` (on the device) as the loss takes it: observations normalized (their
        statistics first take the batch), rewards scaled and clipped, the steps to train on,
        and GAE's targets (V-trace off)."""
        cfg, t = params.appo, self.training
        obs, stats = batch["obs"], t.policy.obs_normalizer.stats
        if self.normalize_input:
            # Once per batch over steps 0..T-1 (step T reappears as step 0 of the next slot).
            # Images: every 8th step. Per-pixel moments over a whole batch took ~0.5 s, a third
            # of a training step here, and a running mean needs no 30k frames per batch.
            for key, rms in stats.items():
                stride = 1 if obs[key].is_floating_point() else _IMAGE_STAT_STRIDE
                rms.update(obs[key][:, : self.rollout : stride])
        # Always through the normalizer, as inference does: without updates its statistics stay
        # at mean 0, variance 1 (images then come out as x / 255). Images come out in the
        # encoder's compute dtype, so it has no cast of its own to make.
        image_dtype = t.policy.model.encoder.compute_dtype(t.device)
        threads = t.policy.model.sequence_threads  # as the pass after it: frames by trajectory

        def normalized(steps: slice) -> dict[str, torch.Tensor]:
            return {k: stats[k].normalize(v[:, steps], image_dtype, threads) if k in stats
                    else v[:, steps] for k, v in obs.items()}

        # GAE: step T's obs apart, for V(x_T) alone; the loss's steps then flatten into the
        # encoder's rows as they are, and step T costs no pass with gradients
        last_step = next(iter(obs.values())).shape[1] - 1
        bootstrap_obs = None if cfg.with_vtrace else normalized(slice(last_step, None))
        obs = normalized(slice(None if cfg.with_vtrace else last_step))
        rewards = (batch["rewards"] * (params.reward_scale * self.env_reward_scale)
                   ).clamp(-cfg.reward_clip, cfg.reward_clip)
        # another policy's steps, and an inactive agent's, feed V-trace only
        data: Trajectories = {**batch, "obs": obs, "rewards": rewards,
                              "valids": self.population.valid_steps(batch),
                              "learner_version": t.version}
        if not cfg.with_vtrace:  # GAE once per batch, from the behaviour-time values
            data["targets"], data["advantages"] = gae_targets(t.policy.model, data, cfg,
                                                              t.returns_normalizer, bootstrap_obs)
        return data

    def _sgd_step(self, minibatch: Trajectories, params: LearnerParams, peers: Peers | None,
                  ) -> tuple[dict[str, float] | None, float | None]:
        """One optimizer step: (loss figures, grad norm), None where non-finite (skipped)."""
        cfg, t = params.appo, self.training
        rn = t.returns_normalizer
        # appo_loss updates the returns statistics; a skipped step must not poison them.
        saved = None if rn is None else {k: v.clone() for k, v in rn.state_dict().items()}
        loss, stats = appo_loss(t.policy.model, minibatch, cfg, rn)
        t.optimizer.zero_grad(set_to_none=True)
        if peers is not None:  # every rank takes every step, so the skip is decided together
            finite = bool(torch.isfinite(loss))
            if finite:
                loss.backward()
            if not peers.average(finite, int(minibatch["valids"].sum())):
                return self._skip(saved, None)
        else:  # a non-finite loss makes non-finite gradients: told apart in the one sync below
            loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            t.policy.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
        names = [name for name in stats if name in TRAINING_FIGURES]
        # The step's one wait for the device (a GPU's queue then drains once, not three times).
        *values, loss_finite, norm = torch.stack(
            [*(stats[n].float() for n in names), torch.isfinite(loss).float(),
             grad_norm.float()]).tolist()
        if not loss_finite:
            return self._skip(saved, None)
        figures = dict(zip(names, values, strict=True))
        if not math.isfinite(norm):
            return self._skip(saved, figures)
        t.optimizer.step()
        return figures, norm

    def _skip(self, saved_returns: dict[str, torch.Tensor] | None,
              figures: dict[str, float] | None) -> tuple[dict[str, float] | None, None]:
        """Leave the weights as they were: no gradient, the returns statistics put back."""
        t = self.training
        t.optimizer.zero_grad(set_to_none=True)
        if saved_returns is not None:
            t.returns_normalizer.load_state_dict(saved_returns)
        return figures, None

    def _running_figures(self) -> dict[str, float]:
        """The observation and returns statistics (where kept), each averaged over its
        elements, as Sample Factory's ``obs_running_mean`` and the like report them."""
        t, parts = self.training, {}
        stats = list(t.policy.obs_normalizer.stats.values()) if self.normalize_input else []
        if stats:
            parts["obs_running_mean"] = torch.cat([s.mean.flatten() for s in stats]).mean()
            parts["obs_running_std"] = torch.cat([s.var.flatten() for s in stats]).sqrt().mean()
        if t.returns_normalizer is not None:
            parts["returns_running_mean"] = t.returns_normalizer.mean.mean()
            parts["returns_running_std"] = t.returns_normalizer.var.sqrt().mean()
        values = torch.stack(list(parts.values())).tolist() if parts else []
        return dict(zip(parts, values, strict=True))


def _reduce(name: str) -> Callable[[list[float]], float]:
    """How a figure of every minibatch makes the batch's: the smallest of ``*_min``, the
    largest of ``*_max``, the mean of the others."""
    return min if name.endswith("_min") else max if name.endswith("_max") else _mean


def _select(data: Trajectories, index: torch.Tensor) -> Trajectories:
    """The trajectories ``index`` of a training batch (a minibatch; whole trajectories)."""
    return {key: {k: v.index_select(0, index) for k, v in value.items()} if isinstance(value, dict)
            else value.index_select(0, index) if isinstance(value, torch.Tensor) else value
            for key, value in data.items()}


def _mean(values: list[float]) -> float:
    """The mean, or NaN for no values (every step of the batch was skipped)."""
    return sum(values) / len(values) if values else math.nan


def _row_means(lag: torch.Tensor, valids: torch.Tensor) -> list[float]:
    """Mean lag of each trajectory's valid steps (trajectories with none are left out)."""
    counts = valids.sum(1)
    means = (lag * valids).sum(1) / counts.clamp(min=1)
    return means[counts > 0].tolist()
