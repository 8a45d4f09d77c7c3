"""The learner of one policy: copies a batch out of shared memory, trains APPO, publishes weights.

Per batch: one gather copy of the batch's trajectories into local tensors (so the workers get their
slots back at once in async mode), V-trace + PPO epochs in a background thread (torch releases the
GIL, so the event loop keeps moving signals meanwhile), then the new weights are published in
shared memory under version + 1. Checkpoints go to ``<run_dir>/checkpoints/policy_<id>/``; a run
directory that already holds some resumes from the newest (``sfbus run FILE --resume RUN_DIR``).

Trajectory length and batch size are the data path's (``rollout``, ``batch_size``); observation
statistics are updated iff ``model.normalize_input``, and observations always go through the
policy's ``ObsNormalizer``, as in inference: vectors by their running statistics, uint8 images per
pixel.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from components.algo import AppoConfig, ReturnsNormalizer, appo_loss
from components.datapath.buffers import (
    STEP_FIELDS,
    PolicyWeights,
    SlotSource,
    TrajectoryBuffer,
    policy_array_specs,
    rollout_workers,
    trajectory_layout,
)
from components.datapath.messages import (
    BatchReady,
    EpisodeFinished,
    LearnerIdle,
    SlotsReleased,
    TrainingStats,
    WeightsUpdated,
)
from components.datapath.settings import DataPathParams
from components.datapath.slot_stages import LearnerSlots
from components.envs import env_spec
from components.learning.checkpoint import config_fingerprint, load_newest
from components.learning.checkpoint_schedule import Kind, LearnerCheckpoints
from components.learning.distributed import Peers, check_supported, join_peers, record_batch
from components.learning.faults import NumericsGuard, restore_published
from components.learning.heap import keep_freed_memory
from components.models.policy import Policy, build_policy, published_size
from components.pbt.member import PopulationMember
from sfbus import ActorContext, ArraySpec, RateLimitedLog, Signal, Topology, slot

Batch = dict[str, Any]
_T = TypeVar("_T")
_LAG_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
# appo_loss's stats averaged over a batch's steps, by their TrainingStats names
_MEAN_STATS = {"policy_loss": "policy_loss", "value_loss": "value_loss", "entropy": "entropy",
               "kl": "kl_approx", "clip_fraction": "clip_fraction"}
_GAUGES = ("policy_loss", "value_loss", "entropy", "kl", "grad_norm", "lr", "train_seconds")


_IMAGE_STAT_STRIDE = 8


class Learner(PopulationMember):
    """Trains one policy with APPO on the batches its batcher sends (PBT slots: the base)."""

    component = "learner"

    @dataclass(frozen=True)
    class Params(DataPathParams):
        """The data path's settings plus the learner's own."""

        policy: int = 0
        """Policy id this learner trains."""
        appo: AppoConfig = field(default_factory=AppoConfig)
        """APPO hyperparameters (``--set appo.lr=...``)."""
        reward_scale: float = 1.0
        """Rewards are multiplied by this before the loss (Sample Factory: 0.01 on doom_basic)."""
        checkpoint_every_s: float = 120.0
        """Seconds between checkpoints (one more is written at a graceful stop)."""
        keep_checkpoints: int = 3
        """Newest checkpoints kept; older ones are deleted."""
        save_best_metric: Literal["true_return", "episode_return", ""] = "true_return"
        """Score of the best checkpoint (``checkpoints/policy_<id>/best``): the mean of the
        last 100 episodes' unshaped score (their return where the env reports none), or of their
        return; "" writes none. Needs ``rollout.episode_finished`` wired to this learner."""
        save_best_after: int = 100_000
        """Env frames trained on before a best checkpoint is written (early means are noise)."""
        save_best_every_s: float = 5.0
        """Seconds at least between two best checkpoints (a rising metric beats it often)."""
        save_milestones_s: float = 0.0
        """Seconds between milestone checkpoints (``milestones/``, all kept); 0: none."""
        torch_threads: int = 1
        """Intra-op threads of torch in this process (1: the learner owns a core;
        ``appo_local_inference.yaml`` gives it 2, sharing the rollout processes' cores)."""
        max_bad_updates: int = 5
        """Non-finite updates in a row after which the last good state is put back."""
        good_state_every: int = 20
        """Batches between the in-memory copies of the last good state."""
        peer_timeout_s: float = 300.0
        """Distributed runs: seconds to wait for the other nodes' learners (joining, each step)."""
        max_failed_batches: int = 3
        """Batches in a row whose training raised after which the learner's process gives up
        (exit 1: restarted by the supervisor); a failing periodic checkpoint is only reported
        and retried at the next interval."""

    learner_idle = Signal(LearnerIdle, "ready for the next batch")
    slots_released = Signal(SlotsReleased, "a worker's slots were copied (one per worker)")
    weights_updated = Signal(WeightsUpdated, "new weights are published")
    training_stats = Signal(TrainingStats, "losses and health figures of one training step")

    def __init__(self, name: str, params: Any = None, context: ActorContext | None = None) -> None:
        super().__init__(name, params, context)
        self.version = 1
        self.train_steps = 0
        self.samples = 0
        self.env_frames = 0
        self.skipped_steps = 0
        self.checkpoints: LearnerCheckpoints | None = None
        """The checkpoint schedule; None without a run directory."""
        self._background: asyncio.Future[Any] | None = None
        self._stopping = False
        self._failed_batches = 0
        self._batch: Batch | None = None
        self.peers: Peers | None = None
        self._warn = RateLimitedLog(self.log, 60.0)
        m = self.metrics
        self._numerics = NumericsGuard(
            self.params.max_bad_updates, self.params.good_state_every, self.log,
            m.counter("good_state_restores", "last good states put back after bad updates"))
        self._m_samples = m.counter("samples", "samples (agent steps) trained on")
        self._m_skipped = m.counter("skipped_steps", "steps skipped: non-finite loss or gradient")
        self._m_checkpoint_failures = m.counter("checkpoint_failures",
                                                "periodic checkpoints that could not be written")
        self._m_lag = m.histogram("policy_lag", "mean policy lag of each trained trajectory",
                                  _LAG_BUCKETS)
        self._m_gauges = {key: m.gauge(key, doc) for key, doc in (
            ("policy_loss", "policy loss of the last batch"),
            ("value_loss", "value loss of the last batch"),
            ("entropy", "policy entropy of the last batch"),
            ("kl", "approximate KL(behavior || current) of the last batch"),
            ("grad_norm", "gradient norm before clipping, last batch"),
            ("lr", "learning rate"),
            ("version", "published weights version"),
            ("train_seconds", "seconds the last batch took to train"),
        )}

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology) -> list[ArraySpec]:
        """The policy's published weights and their version counter."""
        check_supported(params.num_policies)
        return policy_array_specs(params.policy, published_size(params))

    # ----- setup ---------------------------------------------------------------------------

    def build(self) -> None:
        """Create the policy (train mode), the returns normalizer and Adam; no shared memory."""
        p, cfg = self.params, self.params.appo
        torch.set_num_threads(p.torch_threads)
        keep_freed_memory()
        self.spec = env_spec(p.env, **p.env_kwargs)
        self.policy: Policy = build_policy(p).train()
        self.returns_normalizer = ReturnsNormalizer() if cfg.normalize_returns else None
        # fused: one kernel per parameter instead of a dozen ops (clip + Adam 12 -> 4 ms here)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.lr, fused=True,
                                          betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
        self.rng = torch.Generator().manual_seed(p.seed)

    async def on_start(self) -> None:
        """Build, attach the workers' buffers, resume from a checkpoint, publish, say idle."""
        assert self.context is not None
        p = self.params
        self.build()
        topology = self.context.table.topology
        layout = trajectory_layout(p, topology)
        workers = [TrajectoryBuffer(self.context, w, layout)
                   for w in rollout_workers(topology, p.rollout_actor)]
        self._sources = [self._source_views(buffer) for buffer in workers]
        self._slot_stages = LearnerSlots(self.context,
                                         rollout_workers(topology, p.rollout_actor), self.log)
        self.weights = PolicyWeights(self.context, p.policy)
        if self.context.run_dir is not None:
            self.checkpoints = LearnerCheckpoints(
                Path(self.context.run_dir, "checkpoints", f"policy_{p.policy}"), p.policy, p)
            newest = load_newest(self.checkpoints.folder, self.config_fingerprint(),
                                 log=self.log)
            if newest is not None:
                self.restore(newest[1])
                self.log.info("%s: resumed from %s (version %d)", self.name, newest[0],
                              self.version)
        restarted = restore_published(self)  # what we published is newer than a checkpoint
        if restarted:
            self.log.warning("%s: restarted; continues from the weights it published last "
                             "(version %d)", self.name, self.version)
        else:  # a restarted learner cannot rejoin: its peers ended the group when it died
            self.peers = await self._in_thread(join_peers, self)
        self._publish()
        self.learner_idle.emit(LearnerIdle(p.policy))

    def _source_views(self, buffer: TrajectoryBuffer) -> dict[str, SlotSource]:
        # What a batch copies from a worker: whole observations (step T bootstraps), the first T
        # steps of per-step fields, and only the state entering step 0.
        steps = self.params.rollout
        views = {f"obs.{k}": buffer.slot_source(f"obs.{k}", steps + 1) for k in buffer.obs_keys}
        views.update({f: buffer.slot_source(f, steps) for f in STEP_FIELDS if f != "rnn"})
        views["rnn"] = buffer.slot_source("rnn", None, self.params.state_size)
        return views

    # ----- the batch cycle ------------------------------------------------------------------

    @slot
    async def on_batch_ready(self, msg: BatchReady) -> None:
        """Train on the batch; whatever happens, say idle after (the batcher waits for it)."""
        if self._stopping:
            return
        try:
            await self._learn(msg)
            self._failed_batches = 0
        except Exception as error:  # the batcher must not wait forever on a learner that raised
            self._failed_batches += 1
            self.report_failure("on_batch_ready", error)
            if self._failed_batches >= self.params.max_failed_batches:
                self.fail_process(f"{self._failed_batches} batches in a row failed, the last "
                                  f"with {error!r}")
        finally:
            self.learner_idle.emit(LearnerIdle(self.params.policy))

    async def _learn(self, msg: BatchReady) -> None:
        """Copy the batch out, release its slots (async: at once; sync: after training, also when
        it fails), train, publish, report, checkpoint when due."""
        p = self.params
        batch, groups = self.copy_batch(msg)
        to_release = groups
        try:
            if p.mode == "async":
                self._release(to_release)
                to_release = {}
            # Dropped: a restarted worker already refills one of its slots
            # (components.datapath.slot_stages), or it has only steps of weights a PBT exchange
            # replaced.
            if self._slot_stages.torn(groups) or self.discards(batch):
                return
            result = await self._in_thread(self.train, batch)
            self._publish()
        finally:
            if to_release:
                self._release(to_release)
        self._report(result)
        kinds = self.checkpoints.due(self.env_frames) if self.checkpoints is not None else ()
        if kinds:
            try:
                await self._in_thread(self.save, kinds)
            except Exception as error:  # disk full, folder replaced: retried at the next interval
                self._m_checkpoint_failures.inc()
                self.report_failure("checkpoint", error)

    def copy_batch(self, msg: BatchReady) -> tuple[Batch, dict[int, list[int]]]:
        """Gather the batch's trajectories into local tensors, one copy (grouped by worker)."""
        groups: dict[int, list[int]] = {}
        for worker, slot_index in zip(msg.workers, msg.slots, strict=True):
            groups.setdefault(worker, []).append(slot_index)
        n = len(msg.slots)
        if self._batch is None or len(self._batch["rewards"]) != n:
            # Reused across batches: the mailbox runs one batch at a time, and training reads it
            # only until the next copy starts.
            self._batch = {k: torch.empty((n, *v.shape), dtype=v.dtype)
                           for k, v in self._sources[0].items()}
        offset = 0
        for worker, slots in groups.items():
            index = torch.tensor(slots, dtype=torch.int64)
            end = offset + len(slots)
            for key, source in self._sources[worker].items():
                source.copy_into(index, self._batch[key][offset:end])
            offset = end
        return self._batch, groups

    def train(self, batch: Batch) -> dict[str, Any]:
        """APPO epochs over ``batch`` (the ``copy_batch`` layout); bumps the version. Any thread."""
        start = time.perf_counter()
        p, cfg = self.params, self.params.appo
        self._numerics.before_batch(self)  # keeps a copy of the last good state now and then
        obs = {k.removeprefix("obs."): v for k, v in batch.items() if k.startswith("obs.")}
        stats = self.policy.obs_normalizer.stats
        if p.model.normalize_input:
            # Once per batch over steps 0..T-1 (step T reappears as step 0 of the next slot).
            # Images: every 8th step. Per-pixel moments over a whole batch took ~0.5 s, a third
            # of a training step here, and a running mean needs no 30k frames per batch.
            for key, rms in stats.items():
                stride = 1 if obs[key].is_floating_point() else _IMAGE_STAT_STRIDE
                rms.update(obs[key][:, : p.rollout : stride])
        # Always through the normalizer, as inference does: without updates its statistics stay
        # at mean 0, variance 1 (images then come out as x / 255). Images come out in the
        # encoder's compute dtype, so it has no cast of its own to make.
        image_dtype = self.policy.model.encoder.compute_dtype(torch.device("cpu"))
        obs = {k: stats[k].normalize(v, image_dtype) if k in stats else v for k, v in obs.items()}
        valids = self.valid_steps(batch)  # another policy's steps only feed V-trace
        data = {"obs": obs, "rnn_states": batch["rnn"], "actions": batch["actions"],
                "log_probs": batch["log_probs"], "values": batch["values"],
                "rewards": batch["rewards"] * p.reward_scale, "dones": batch["dones"],
                "policy_versions": batch["versions"], "valids": valids,
                "learner_version": self.version}
        figures: list[dict[str, float]] = []
        norms: list[float] = []
        skipped = 0
        for _ in range(cfg.num_epochs):
            for index in self._minibatches(len(valids)):
                loss_figures, grad_norm = self._sgd_step(
                    data if index is None else _select(data, index))
                skipped += grad_norm is None
                self._numerics.after_step(self, grad_norm is not None)  # N bad: last good state
                figures += [loss_figures] if loss_figures is not None else []
                norms += [grad_norm] if grad_norm is not None else []
        lag = (self.version - batch["versions"]).float()
        samples = int(valids.sum())
        self.version += 1
        self.train_steps += 1
        self.samples += samples
        self.env_frames += samples * self.spec.frameskip
        if self.peers is not None:
            record_batch(self, self.peers, samples)
        result: dict[str, Any] = {k: _mean([f[k] for f in figures]) for k in _MEAN_STATS}
        result.update(
            grad_norm=_mean(norms), skipped=skipped, samples=samples,
            lag_mean=float(lag[valids].mean()) if samples else 0.0,
            lag_max=float(lag[valids].max()) if samples else 0.0,
            trajectory_lags=_row_means(lag, valids), train_seconds=time.perf_counter() - start)
        return result

    def _minibatches(self, num: int) -> tuple[torch.Tensor | None, ...]:
        """Trajectory indices of each minibatch of one epoch, shuffled (None: the whole batch)."""
        parts = self.params.appo.num_batches_per_epoch
        if parts == 1:
            return (None,)
        return torch.randperm(num, generator=self.rng).tensor_split(parts)

    def _sgd_step(self, minibatch: Batch) -> tuple[dict[str, float] | None, float | None]:
        """One Adam step: (loss figures, grad norm), None where non-finite (the step skipped)."""
        cfg, rn = self.params.appo, self.returns_normalizer
        # appo_loss updates the returns statistics; a skipped step must not poison them.
        saved = None if rn is None else {k: v.clone() for k, v in rn.state_dict().items()}
        loss, stats = appo_loss(self.policy.model, minibatch, cfg, rn)
        finite = bool(torch.isfinite(loss))
        self.optimizer.zero_grad(set_to_none=True)
        if finite:
            loss.backward()
        if self.peers is not None:  # every rank takes every step, so the skip is decided together
            finite = self.peers.average(finite, int(minibatch["valids"].sum()))
        if not finite:
            if rn is not None:
                rn.load_state_dict(saved)
            return None, None
        figures = {name: float(stats[key]) for name, key in _MEAN_STATS.items()}
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.policy.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            if rn is not None:
                rn.load_state_dict(saved)
            return figures, None
        self.optimizer.step()
        return figures, float(grad_norm)

    def _release(self, groups: dict[int, list[int]]) -> None:
        self._slot_stages.consume(groups)  # before the release: a restarted worker reclaims them
        for worker, slots in groups.items():
            self.slots_released.emit(SlotsReleased(worker, tuple(slots)), key=worker)

    def _publish(self) -> None:
        self.weights.publish(self.policy.published_tensors(), self.version)
        self.weights_updated.emit(WeightsUpdated(self.params.policy, self.version))
        self._m_gauges["version"].set(self.version)

    def _report(self, r: dict[str, Any]) -> None:
        if r["skipped"]:
            self.skipped_steps += r["skipped"]
            self._m_skipped.inc(r["skipped"])
            self._warn.warning("skipped", "%s: skipped %d optimizer steps with a non-finite loss "
                               "or gradient (%d so far)", self.name, r["skipped"],
                               self.skipped_steps)
        self._m_samples.inc(r["samples"])
        for lag in r["trajectory_lags"]:
            self._m_lag.observe(lag)
        stats = TrainingStats(
            policy=self.params.policy, version=self.version, env_frames=self.env_frames,
            lr=float(self.optimizer.param_groups[0]["lr"]),
            **{k: r[k] for k in (*_MEAN_STATS, "samples", "grad_norm", "lag_mean", "lag_max",
                                 "train_seconds")})
        for key in _GAUGES:
            self._m_gauges[key].set(getattr(stats, key))
        self.training_stats.emit(stats)

    async def _in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        # Shielded so that a stop waits for the thread instead of abandoning it mid-update.
        self._background = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        return await asyncio.shield(self._background)

    # ----- checkpoints ----------------------------------------------------------------------

    def config_fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed (see ``checkpoint.config_fingerprint``)."""
        return config_fingerprint(self.params.env, self.params.model)

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint holds (live tensors: call between training steps)."""
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "returns_normalizer": None if self.returns_normalizer is None
            else self.returns_normalizer.state_dict(),
            "version": self.version,
            "env_frames": self.env_frames,
            "train_steps": self.train_steps,
            "samples": self.samples,
            "config": self.config_fingerprint(),
            "rng": self.rng.get_state(),
            **self.population_state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's state (from ``load_checkpoint``) into the built learner."""
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.returns_normalizer is not None and state.get("returns_normalizer") is not None:
            self.returns_normalizer.load_state_dict(state["returns_normalizer"])
        if state.get("rng") is not None:
            self.rng.set_state(state["rng"])
        self.version = int(state["version"])
        self.env_frames = int(state["env_frames"])
        self.train_steps = int(state["train_steps"])
        self.samples = int(state["samples"])
        if self.checkpoints is not None:
            self.checkpoints.restore(state)
        self.restore_population(state)

    def save(self, kinds: tuple[Kind, ...] = ("latest",)) -> Path | None:
        """Write the current state as checkpoints of ``kinds``; returns the first one written
        (None without a run directory)."""
        if self.checkpoints is None:
            return None
        return self.checkpoints.write(self.state(), self.version, kinds)[0]

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Count an episode of this policy towards the best checkpoint's metric."""
        if self.checkpoints is not None:
            self.checkpoints.on_episode(msg)

    async def on_stop(self) -> None:
        """Wait for an in-flight training step or save, then write the final checkpoint."""
        self._stopping = True
        # A finished step's continuation may start a periodic save: wait until nothing runs.
        while self._background is not None and not self._background.done():
            await asyncio.wait({self._background})
        if self.peers is not None:  # before saving: the others may be waiting in a step for us
            await self._in_thread(self.peers.close)
        path = self.save()  # on the loop: nothing else may touch the model now
        if path is not None:
            self.log.info("%s: final checkpoint %s (version %d)", self.name, path, self.version)


def _select(data: Batch, index: torch.Tensor) -> Batch:
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
