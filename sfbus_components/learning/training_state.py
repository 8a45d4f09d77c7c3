"""One policy's training state: what training changes, on the device it trains on.

:class:`TrainingState` holds the policy (model and observation normalizer), the optimizer (Adam or
LAMB, with the learning rate a schedule moves), the returns normalizer, the minibatch shuffle's
generator and the counters (version, env frames, training steps, samples). Everything that reads or
replaces it goes through it: checkpoints, the numerics guard's last good state
(:mod:`sfbus_components.learning.faults`), the distributed group's rank-0 state
(:mod:`sfbus_components.learning.distributed`) and PBT's weight exchange
(:mod:`sfbus_components.learning.population_member`).

It lives on one ``torch.device`` (the CPU unless told otherwise). Checkpoints stay
device-independent: :meth:`TrainingState.state_dict` gives CPU tensors and
:meth:`TrainingState.load_state_dict` takes tensors on any device, so a run trained on a GPU
resumes on a CPU and the other way round. A batch enters the device in one place,
:meth:`TrainingState.to_device`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from sfbus_components.algo import AppoConfig
from sfbus_components.algo.lamb import Lamb
from sfbus_components.models.normalizers import ReturnsNormalizer
from sfbus_components.models.policy import Policy

# The keys of state_dict() beside the learned state, each an integer.
_COUNTERS = ("version", "env_frames", "train_steps", "samples")


class TrainingState:
    """The policy, optimizer, normalizers and counters of one learner, on ``device``."""

    def __init__(self, policy: Policy, appo: AppoConfig, seed: int = 0,
                 device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        """Where the policy, the optimizer's moments and the normalizers live and batches go."""
        if self.device.type == "cuda":
            # Every batch has the same shapes: let cuDNN time its convolution algorithms on the
            # first and keep the fastest, as Sample Factory's GPU learner does.
            torch.backends.cudnn.benchmark = True
        self.policy = policy.to(self.device).train()
        self.returns_normalizer = (ReturnsNormalizer().to(self.device)
                                   if appo.normalize_returns else None)
        betas = (appo.adam_beta1, appo.adam_beta2)
        # Adam fused: one kernel per parameter instead of a dozen ops (clip + Adam 12 -> 4 ms here)
        self.optimizer: torch.optim.Optimizer = (
            Lamb(self.policy.parameters(), lr=appo.lr, betas=betas, eps=appo.adam_eps)
            if appo.optimizer == "lamb" else
            torch.optim.Adam(self.policy.parameters(), lr=appo.lr, fused=True, betas=betas,
                             eps=appo.adam_eps))
        # On the CPU whatever the device: the same seed shuffles the same minibatches, and a
        # checkpoint's generator state loads on any device.
        self.rng = torch.Generator().manual_seed(seed)
        self.version = 1
        """Version of the weights: published after each batch, starting at 1."""
        self.env_frames = 0
        """Env frames trained on (samples times the env's frameskip)."""
        self.train_steps = 0
        """Batches trained on."""
        self.samples = 0
        """Agent steps trained on."""

    def set_hyperparameters(self, appo: AppoConfig) -> None:
        """Make the optimizer use ``appo``'s betas, epsilon and (under a constant schedule; a
        schedule owns the rate otherwise) learning rate: PBT changes them."""
        for group in self.optimizer.param_groups:
            if appo.lr_schedule == "constant":
                group["lr"] = appo.lr
            group["betas"] = (appo.adam_beta1, appo.adam_beta2)
            group["eps"] = appo.adam_eps

    @property
    def lr(self) -> float:
        """The optimizer's learning rate now (saved with its state in checkpoints)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        """Set the optimizer's learning rate (a schedule's next value)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def to_device(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` (tensors, or mappings of them: a ``Trajectories``'s ``obs``) on the training
        device, keyed as it is: the one place host memory enters it (on the CPU the same
        tensors, no copy)."""
        return {key: self.to_device(value) if isinstance(value, Mapping)
                else value.to(self.device, non_blocking=True) for key, value in batch.items()}

    def minibatches(self, num: int, parts: int,
                    shuffle: bool = True) -> tuple[torch.Tensor | None, ...]:
        """Indices of ``num`` trajectories in ``parts`` minibatches, on the device, shuffled or
        in buffer order (``(None,)``: one minibatch, the whole batch in its order)."""
        if parts == 1:
            return (None,)
        order = torch.randperm(num, generator=self.rng) if shuffle else torch.arange(num)
        return order.to(self.device).tensor_split(parts)

    # ----- what is learned: policy, Adam, returns normalizer ---------------------------------

    def learned_state(self) -> dict[str, Any]:
        """The policy's, Adam's and the returns normalizer's state: live tensors on the device
        (read between training steps)."""
        rn = self.returns_normalizer
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "returns_normalizer": None if rn is None else rn.state_dict()}

    def load_learned_state(self, state: Mapping[str, Any]) -> None:
        """Copy a :meth:`learned_state` (from any device) in; ``state`` stays intact. Adam's
        hyperparameters come with it (see :meth:`set_hyperparameters`)."""
        self.policy.load_state_dict(state["policy"])
        # Adam keeps the tensors it is given when they are on its device already: give it a copy.
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        if self.returns_normalizer is not None and state.get("returns_normalizer") is not None:
            self.returns_normalizer.load_state_dict(state["returns_normalizer"])

    def snapshot(self) -> dict[str, Any]:
        """A copy of :meth:`learned_state` on the device, for :meth:`load_learned_state` later."""
        return copy.deepcopy(self.learned_state())

    def weights_finite(self) -> bool:
        """True if every weight is finite."""
        # one read for all of them: on a GPU each read waits for the device
        return bool(torch.stack([torch.isfinite(p).all() for p in self.policy.parameters()]).all())

    # ----- the whole state, as checkpoints hold it -------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint needs of training, with CPU tensors (on the CPU: live ones,
        so read it between training steps)."""
        state = {**self.learned_state(), "rng": self.rng.get_state(),
                 **{key: getattr(self, key) for key in _COUNTERS}}
        return _to_cpu(state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a :meth:`state_dict` (tensors on any device: ``load_checkpoint`` maps them)."""
        self.load_learned_state(state)
        if state.get("rng") is not None:
            self.rng.set_state(state["rng"].cpu())
        for key in _COUNTERS:
            setattr(self, key, int(state[key]))


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it on the CPU (nested dicts, lists and tuples)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value
