"""The policy as the learner trains it and inference workers run it: model plus normalizer.

Built from the env's spec and the model's config alone; the data path builds the run's
(:func:`sfbus_components.datapath.settings.build_policy`).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from sfbus_components.envs import EnvSpec
from sfbus_components.envs.action_bounds import ActionMap
from sfbus_components.envs.spec import ACTION_MASK_KEY
from sfbus_components.models import ActorCritic, ModelConfig, StepOutput
from sfbus_components.models.graphed_step import MAX_ROWS, GraphedStep
from sfbus_components.models.normalizers import ObsNormalizer
from sfbus_components.models.packed import PackedStep, packable

_CPU = torch.device("cpu")


class PublishedWeights(Protocol):
    """Where a learner publishes a policy's weights (the data path's ``PolicyWeights``)."""

    def read_into(self, tensors: list[torch.Tensor]) -> int:
        """Copy the newest weights into ``tensors`` (in :meth:`Policy.published_tensors`'
        order); returns their version."""

    def page_lock(self) -> bool:
        """Pin the weights' pages, so a GPU reads them in one transfer; False where it cannot."""


class Policy(nn.Module):
    """The actor-critic network and the running observation normalizer it is fed through."""

    def __init__(self, spec: EnvSpec, cfg: ModelConfig) -> None:
        super().__init__()
        if spec.is_continuous:  # refuses a squash onto an unbounded Box, at validation
            ActionMap(spec, cfg.action_bounds)
        obs_spec = {k: (f.shape, f.dtype) for k, f in spec.observation_space.items()}
        # normalize_input off means no normalization at all (not even clipping), but for
        # obs_subtract_mean / obs_scale; the action mask is read as it is (> 0 = allowed)
        self.obs_normalizer = ObsNormalizer(
            {k: v for k, v in obs_spec.items() if k != ACTION_MASK_KEY},
            running=cfg.normalize_input, subtract_mean=cfg.obs_subtract_mean, scale=cfg.obs_scale,
            keys=cfg.normalize_input_keys)
        self.model = ActorCritic(
            obs_spec,
            action_heads=spec.action_heads or None,
            action_dim=spec.box_size or None,
            cfg=cfg,
        )
        self.packed: PackedStep | None = None
        """Set by :meth:`prepare_for_inference` where the model can run on packed weights."""
        self.device = _CPU
        """Where :meth:`prepare_for_inference` put the policy."""
        self.graphed: GraphedStep | None = None
        """Set by :meth:`prepare_for_inference` with ``cuda_graphs`` on a GPU."""

    def prepare_for_inference(self, packed: bool = True, device: torch.device = _CPU,
                              cuda_graphs: bool = False) -> Policy:
        """Eval mode, no gradients, on ``device``, with the fastest step it offers: on a CPU,
        weights reordered for oneDNN where the model allows it and ``packed`` is on
        (:mod:`sfbus_components.models.packed`), else (and on a GPU) the encoder's weights kept in
        its compute dtype; on a GPU with ``cuda_graphs``, the step replayed from CUDA graphs
        (:mod:`sfbus_components.models.graphed_step`). New weights then come in through
        :meth:`read_weights`."""
        self.eval().requires_grad_(False).to(device)
        self.device = device
        if packed and device.type == "cpu" and packable(self.model):
            self.packed = PackedStep(self.model)
        else:
            for encoder in self.model.encoders():
                encoder.keep_weights_in_compute_dtype(device)
        if device.type != "cpu":
            # Published weights reach the device in one upload per version (the seqlock read
            # is one transfer of the whole page-locked vector), then device-side copies (and
            # casts) into the parameters, instead of one small transfer per tensor.
            size = sum(t.numel() for t in self.published_tensors())
            self._uploaded = torch.empty(size, device=device)
            self._downloads = _PinnedOutputs()
            if cuda_graphs:
                self.graphed = GraphedStep(self._step, device)
        return self

    def read_weights(self, weights: PublishedWeights) -> int:
        """Copy the learner's published weights in (packing them again when packed); returns
        the version read."""
        if self.device.type == "cpu":
            version = weights.read_into(self.published_tensors())
            if self.packed is not None:
                self.packed.pack()
            return version
        weights.page_lock()
        version = weights.read_into([self._uploaded])
        offset = 0
        with torch.no_grad():
            for tensor in self.published_tensors():
                n = tensor.numel()
                tensor.copy_(self._uploaded[offset:offset + n].view_as(tensor))
                offset += n
        with torch.inference_mode():  # the factors an inference step made, written in place
            self.obs_normalizer.refresh_affine()
        return version

    def step(self, obs: dict[str, torch.Tensor], rnn_state: torch.Tensor,
             deterministic: bool = False, generator: torch.Generator | None = None) -> StepOutput:
        """One inference step on raw observations: normalize, then the model's forward step,
        sampling actions from ``generator`` (default: torch's global one; on a GPU, one of that
        device). Inputs and outputs are on the host whatever the policy's device: on a GPU the
        rows go up (non-blocking from pinned memory) and the results come back in one sync, into
        pinned buffers that the next step reuses."""
        if self.device.type == "cpu":
            return self._step(obs, rnn_state, deterministic, generator)
        device = self.device
        if self.graphed is not None and len(rnn_state) <= MAX_ROWS:
            out = self.graphed(obs, rnn_state, deterministic, generator)
        else:
            out = self._step({k: v.to(device, non_blocking=True) for k, v in obs.items()},
                             rnn_state.to(device, non_blocking=True), deterministic, generator)
        return self._downloads.fetch(out, device)

    def _step(self, obs: dict[str, torch.Tensor], rnn_state: torch.Tensor,
              deterministic: bool, generator: torch.Generator | None) -> StepOutput:
        normalized = self.obs_normalizer(obs)
        if self.packed is not None:
            return self.packed(normalized, rnn_state, deterministic, generator,
                               normalized.get(ACTION_MASK_KEY))
        return self.model.forward_step(normalized, rnn_state, deterministic, generator)

    def published_tensors(self) -> list[torch.Tensor]:
        """Every tensor inference needs, in a fixed order (parameters, then buffers)."""
        return [*self.parameters(), *(b for b in self.buffers())]


class _PinnedOutputs:
    """Pinned host buffers a GPU step's outputs come back into, grown (doubling) as needed."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []

    def fetch(self, out: StepOutput, device: torch.device) -> StepOutput:
        """``out`` copied to the host: non-blocking copies, then one wait for all of them."""
        fields = (out.actions, out.log_prob, out.value, out.rnn_state, out.action_logits)
        rows = len(out.actions)
        if not self.buffers or len(self.buffers[0]) < rows or any(
                b.dtype != f.dtype or b.shape[1:] != f.shape[1:]
                for b, f in zip(self.buffers, fields, strict=True)):
            capacity = max(rows, 2 * len(self.buffers[0]) if self.buffers else 0)
            self.buffers = [torch.empty((capacity, *f.shape[1:]), dtype=f.dtype, pin_memory=True)
                            for f in fields]
        host = [b[:rows] for b in self.buffers]
        for target, source in zip(host, fields, strict=True):
            target.copy_(source, non_blocking=True)
        torch.cuda.current_stream(device).synchronize()
        return StepOutput(*host)
