"""A learner's part in population-based training: hyperparameter changes and weight exchanges.

A learner owns a :class:`PopulationMember` over its training state and hands it PBT's two commands
from its ``async`` slots, which run from the learner's mailbox between two training steps, never
during one:

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

The PBT actor (:mod:`sfbus_components.pbt.trainer`, above learning) finds the members of a
topology by their ``on_replace_policy`` slot (:func:`is_population_member`); learning never
imports PBT.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from sfbus import Actor
from sfbus_components.algo import AppoConfig
from sfbus_components.datapath.messages import ReplacePolicy
from sfbus_components.learning.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from sfbus_components.learning.training_state import TrainingState

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


class MemberParams(Protocol):
    """What PBT reads and replaces of a member's parameters (a learner's ``Params``)."""

    @property
    def policy(self) -> int:
        """The policy the member trains."""

    @property
    def appo(self) -> AppoConfig:
        """Its APPO hyperparameters (``appo.*``)."""

    @property
    def reward_scale(self) -> float:
        """Its reward scale (``reward_scale``)."""


_P = TypeVar("_P", bound=MemberParams)


def is_population_member(actor_class: type) -> bool:
    """True for an actor class that PBT manages: one with a slot taking weight exchanges."""
    return (issubclass(actor_class, Actor)
            and ReplacePolicy in actor_class.slot_types().values())


class PopulationMember:
    """A learner's state and steps in PBT (see the module docstring), over its training state."""

    def __init__(self, policy: int, training: TrainingState, config: Mapping[str, Any],
                 run_dir: str | Path | None, log: logging.Logger, name: str) -> None:
        self.policy = policy
        self.training = training
        self.config = dict(config)
        """The learner's checkpoint fingerprint: a snapshot must match it."""
        self.run_dir = run_dir
        self.log = log
        self.name = name
        self.min_version = 0
        """Steps acted by an older version are not trained on (set by a weight exchange)."""
        self.hyperparams: dict[str, float] = {}
        """Hyperparameters PBT set, by name (``appo.lr``, ...)."""

    # ----- which steps to train on -----------------------------------------------------------

    def valid_steps(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Steps to train on: acted by this policy, by an active agent (not the buffer's
        ``inactive``: a multi-agent env's ``is_active``), with weights no older than
        ``min_version``.

        Another policy's steps (a trajectory where the agent switched policy) and an inactive
        agent's steps only feed V-trace.
        """
        valid = batch["policies"] == self.policy
        if "inactive" in batch:
            valid &= batch["inactive"] == 0
        if self.min_version:
            valid &= batch["versions"] >= self.min_version
        return valid

    def discards(self, batch: Mapping[str, torch.Tensor]) -> bool:
        """True when no step of ``batch`` may be trained on (collected before an exchange)."""
        return not bool(self.valid_steps(batch).any())

    # ----- hyperparameters and checkpoints ---------------------------------------------------

    def apply_hyperparams(self, params: _P, values: Mapping[str, float]) -> _P:
        """``params`` with ``appo.<field>`` and ``reward_scale`` set from ``values`` (Adam
        follows); ``reward_shaping.*`` is the rollout workers' and only remembered."""
        appo_fields = {f.name for f in dataclasses.fields(params.appo)}
        appo: dict[str, Any] = {}
        top: dict[str, Any] = {}
        for name, value in values.items():
            key = name.removeprefix("appo.")
            if name.startswith("appo.") and key in appo_fields:
                appo[key] = type(getattr(params.appo, key))(value)
            elif name == "reward_scale":
                top[name] = float(value)
            elif not name.startswith("reward_shaping."):
                self.log.warning("%s: ignored unknown hyperparameter %r", self.name, name)
                continue
            self.hyperparams[name] = float(value)
        params = dataclasses.replace(params, appo=dataclasses.replace(params.appo, **appo), **top)
        self.training.set_hyperparameters(params.appo)
        return params

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of PBT's changes."""
        return {"hyperparams": dict(self.hyperparams), "min_version": self.min_version}

    def restore(self, state: Mapping[str, Any], params: _P) -> _P:
        """Take PBT's changes back from a checkpoint's state: ``params`` with them applied."""
        self.min_version = int(state.get("min_version", 0))
        if state.get("hyperparams"):
            return self.apply_hyperparams(params, dict(state["hyperparams"]))
        return params

    # ----- weight exchange -------------------------------------------------------------------

    def write_snapshot(self, msg: ReplacePolicy, state: Mapping[str, Any]) -> None:
        """The source's side: write ``state`` (the learner's checkpoint) for the target. Runs
        on a thread, between two training steps."""
        if self.run_dir is None:
            self.log.error("%s: exchange %d needs a run directory", self.name, msg.exchange)
            return
        save_checkpoint(snapshot_dir(self.run_dir, msg.exchange), state, self.training.version, 1)
        self.log.info("%s: snapshot of version %d for exchange %d (policy %d copies it)",
                      self.name, self.training.version, msg.exchange, msg.policy)

    async def take_snapshot(self, msg: ReplacePolicy, appo: AppoConfig,
                            stopping: Callable[[], bool]) -> int | None:
        """The target's side: wait for the source's snapshot and load its learned state as the
        next version, keeping Adam on ``appo``; the source's version, None if none came."""
        path = await self._wait_for_snapshot(msg, stopping)
        if path is None:
            self.log.error("%s: no snapshot of policy %d for exchange %d within %.0f s; keeping "
                           "the current weights", self.name, msg.source, msg.exchange,
                           SNAPSHOT_TIMEOUT_S)
            return None
        state = await asyncio.to_thread(load_checkpoint, path, self.config,
                                        map_location=self.training.device)
        # All of it between two training steps: the next step sees the source's state whole.
        self.training.load_learned_state(state)
        self.training.set_hyperparameters(appo)  # the source's arrive as HyperparamsChanged
        self.training.version += 1
        self.min_version = self.training.version
        source_version = int(state["version"])
        self.log.info("%s: now a copy of policy %d (its version %d) as version %d; older "
                      "experience is discarded", self.name, msg.source, source_version,
                      self.training.version)
        return source_version

    async def _wait_for_snapshot(self, msg: ReplacePolicy,
                                 stopping: Callable[[], bool]) -> Path | None:
        if self.run_dir is None:
            return None
        directory = snapshot_dir(self.run_dir, msg.exchange)
        deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
        while time.monotonic() < deadline and not stopping():
            path = latest_checkpoint(directory)  # appears whole: written, then renamed
            if path is not None:
                return path
            await asyncio.sleep(0.05)
        return None
