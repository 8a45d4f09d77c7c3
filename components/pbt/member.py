"""A learner's part in population-based training: hyperparameter changes and weight exchanges.

:class:`PopulationMember` is a base class of :class:`components.learning.learner.Learner`. Its slots
are ``async``, so they run from the learner's mailbox between two training steps, never during one:

- ``on_hyperparams_changed``: new ``appo.*`` / ``reward_scale`` values replace the learner's
  parameters and the optimizer's learning rate, betas and epsilon (``reward_shaping.*`` names
  belong to the rollout workers). They are kept in checkpoints.
- ``on_replace_policy`` (exchange ``e``, target ``T``, source ``S``): the learner of ``S`` writes
  a snapshot of its whole training state (model with observation normalizer, optimizer, returns
  normalizer) to ``RUN_DIR/checkpoints/pbt/snapshots/exchange_<e>/``; the learner of ``T`` waits
  for it, loads all of it at once, publishes it as its next version ``v``, checkpoints it, and
  from then on trains only on steps that inference produced with version >= ``v``
  (``min_version``): batches already queued or in flight, collected by the replaced weights, are
  copied, released and skipped. It keeps its own version counter (inference reloads because the
  version grew) and frame counts. The PBT actor keeps the snapshots of the last few exchanges.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from components.learning.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from components.pbt.messages import HyperparamsChanged, PolicyReplaced, ReplacePolicy
from sfbus import Actor, Signal, slot

SNAPSHOT_TIMEOUT_S = 120.0
"""How long a target waits for its source's snapshot (the source writes it after its current
training step)."""


def snapshot_dir(run_dir: str | Path, exchange: int) -> Path:
    """Where the source of exchange ``exchange`` writes its snapshot."""
    return Path(run_dir, "checkpoints", "pbt", "snapshots", f"exchange_{exchange:06d}")


def prune_snapshots(run_dir: str | Path, keep: int, pending: set[int]) -> None:
    """Delete the snapshots of all but the newest ``keep`` exchanges, except ``pending`` ones."""
    parent = snapshot_dir(run_dir, 0).parent
    if not parent.is_dir():
        return
    done = sorted(d for d in parent.glob("exchange_*")
                  if int(d.name.removeprefix("exchange_")) not in pending)
    for old in done[:-keep] if keep > 0 else done:
        with contextlib.suppress(OSError):
            shutil.rmtree(old)


class PopulationMember(Actor):
    """Slots and state of a learner that PBT manages (see the module docstring)."""

    policy_replaced = Signal(PolicyReplaced, "this learner now trains a copy of another policy")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.min_version = 0
        """Steps acted by an older version are not trained on (set by a weight exchange)."""
        self.hyperparams: dict[str, float] = {}
        """Hyperparameters PBT set, by name (``appo.lr``, ...)."""

    # ----- hooks for the learner -------------------------------------------------------------

    def valid_steps(self, batch: dict[str, Any]) -> torch.Tensor:
        """Steps to train on: acted by this policy, with weights no older than ``min_version``.

        Another policy's steps (a trajectory where the agent switched policy) only feed V-trace.
        """
        valid = batch["policies"] == self.params.policy
        if self.min_version:
            valid &= batch["versions"] >= self.min_version
        return valid

    def discards(self, batch: dict[str, Any]) -> bool:
        """True when no step of ``batch`` may be trained on (collected before an exchange)."""
        return not bool(self.valid_steps(batch).any())

    def population_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of PBT's changes."""
        return {"hyperparams": dict(self.hyperparams), "min_version": self.min_version}

    def restore_population(self, state: dict[str, Any]) -> None:
        """Re-apply PBT's changes from a checkpoint's state."""
        self.min_version = int(state.get("min_version", 0))
        if state.get("hyperparams"):
            self.apply_hyperparams(dict(state["hyperparams"]))

    # ----- hyperparameters -------------------------------------------------------------------

    @slot
    async def on_hyperparams_changed(self, msg: HyperparamsChanged) -> None:
        """Apply this policy's new hyperparameters (between training steps)."""
        if msg.policy == self.params.policy:
            self.apply_hyperparams(dict(zip(msg.names, msg.values, strict=True)))

    def apply_hyperparams(self, values: dict[str, float]) -> None:
        """Set ``appo.<field>`` and ``reward_scale`` values; ignore ``reward_shaping.*``."""
        p = self.params
        appo_fields = {f.name: f for f in dataclasses.fields(p.appo)}
        appo: dict[str, Any] = {}
        top: dict[str, Any] = {}
        for name, value in values.items():
            key = name.removeprefix("appo.")
            if name.startswith("appo.") and key in appo_fields:
                appo[key] = type(getattr(p.appo, key))(value)
            elif name == "reward_scale":
                top[name] = float(value)
            elif not name.startswith("reward_shaping."):
                self.log.warning("%s: ignored unknown hyperparameter %r", self.name, name)
                continue
            self.hyperparams[name] = float(value)
        self.params = dataclasses.replace(p, appo=dataclasses.replace(p.appo, **appo), **top)
        self._sync_optimizer()

    def _sync_optimizer(self) -> None:
        """Make the optimizer use the learner's current APPO settings."""
        cfg = self.params.appo
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
            group["betas"] = (cfg.adam_beta1, cfg.adam_beta2)
            group["eps"] = cfg.adam_eps

    # ----- weight exchange -------------------------------------------------------------------

    @slot
    async def on_replace_policy(self, msg: ReplacePolicy) -> None:
        """Source: write a snapshot. Target: load the source's snapshot (see the docstring)."""
        me = self.params.policy
        if msg.source == me and msg.policy != me:
            await self._write_snapshot(msg)
        elif msg.policy == me and msg.source != me:
            await self._take_snapshot(msg)

    async def _write_snapshot(self, msg: ReplacePolicy) -> None:
        if self.context is None or self.context.run_dir is None:
            self.log.error("%s: exchange %d needs a run directory", self.name, msg.exchange)
            return
        directory = snapshot_dir(self.context.run_dir, msg.exchange)
        await self._in_thread(save_checkpoint, directory, self.state(), self.version, 1)
        self.log.info("%s: snapshot of version %d for exchange %d (policy %d copies it)",
                      self.name, self.version, msg.exchange, msg.policy)

    async def _take_snapshot(self, msg: ReplacePolicy) -> None:
        path = await self._wait_for_snapshot(msg)
        if path is None:
            self.log.error("%s: no snapshot of policy %d for exchange %d within %.0f s; keeping "
                           "the current weights", self.name, msg.source, msg.exchange,
                           SNAPSHOT_TIMEOUT_S)
            self.policy_replaced.emit(PolicyReplaced(self.params.policy, msg.source,
                                                     msg.exchange, self.version, -1, ok=False))
            return
        state = await asyncio.to_thread(load_checkpoint, path, self.config_fingerprint())
        # All of it between two training steps: the next step sees the source's state whole.
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._sync_optimizer()  # the source's hyperparameters arrive as HyperparamsChanged
        if self.returns_normalizer is not None and state.get("returns_normalizer") is not None:
            self.returns_normalizer.load_state_dict(state["returns_normalizer"])
        self.version += 1
        self.min_version = self.version
        self._numerics.forget()  # a later numerics restore must not bring back the old weights
        self._publish()  # inference sees a newer version and reloads at once
        source_version = int(state["version"])
        self.log.info("%s: now a copy of policy %d (its version %d) as version %d; older "
                      "experience is discarded", self.name, msg.source, source_version,
                      self.version)
        if self.checkpoints is not None:
            await self._in_thread(self.save)  # a resume must not undo the exchange
        self.policy_replaced.emit(PolicyReplaced(self.params.policy, msg.source, msg.exchange,
                                                 self.version, source_version))

    async def _wait_for_snapshot(self, msg: ReplacePolicy) -> Path | None:
        if self.context is None or self.context.run_dir is None:
            return None
        directory = snapshot_dir(self.context.run_dir, msg.exchange)
        deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
        while time.monotonic() < deadline and not self._stopping:
            path = latest_checkpoint(directory)  # appears whole: written, then renamed
            if path is not None:
                return path
            await asyncio.sleep(0.05)
        return None
