"""The policy as the learner trains it and inference workers run it: model plus normalizer."""

from __future__ import annotations

import math

import torch
from torch import nn

from components.algo import ObsNormalizer
from components.datapath.buffers import PolicyWeights
from components.datapath.settings import DataPathParams
from components.envs import EnvSpec, env_spec
from components.models import ActorCritic, StepOutput
from components.models.packed import PackedStep, packable


class Policy(nn.Module):
    """The actor-critic network and the running observation normalizer it is fed through."""

    def __init__(self, spec: EnvSpec, params: DataPathParams) -> None:
        super().__init__()
        obs_spec = {k: (f.shape, f.dtype) for k, f in spec.observation_space.items()}
        # normalize_input off means no normalization at all (not even clipping)
        self.obs_normalizer = ObsNormalizer(obs_spec if params.model.normalize_input else {})
        self.model = ActorCritic(
            obs_spec,
            action_heads=spec.action_heads or None,
            action_dim=None if spec.action_box is None else math.prod(spec.action_box.shape),
            cfg=params.model,
        )
        self.packed: PackedStep | None = None
        """Set by :meth:`prepare_for_inference` where the model can run on packed weights."""

    def prepare_for_inference(self, packed: bool = True) -> Policy:
        """Eval mode, no gradients, and the fastest step this CPU offers: weights reordered
        for oneDNN where the model allows it and ``packed`` is on
        (:mod:`components.models.packed`), else the encoder's weights kept in its compute
        dtype. New weights then come in through :meth:`read_weights`."""
        self.eval().requires_grad_(False)
        if packed and packable(self.model):
            self.packed = PackedStep(self.model)
        else:
            self.model.encoder.keep_weights_in_compute_dtype(torch.device("cpu"))
        return self

    def read_weights(self, weights: PolicyWeights) -> int:
        """Copy the learner's published weights in (packing them again when packed); returns
        the version read."""
        version = weights.read_into(self.published_tensors())
        if self.packed is not None:
            self.packed.pack()
        return version

    def step(self, obs: dict[str, torch.Tensor], rnn_state: torch.Tensor,
             deterministic: bool = False, generator: torch.Generator | None = None) -> StepOutput:
        """One inference step on raw observations: normalize, then the model's forward step,
        sampling actions from ``generator`` (default: torch's global one)."""
        normalized = self.obs_normalizer(obs)
        if self.packed is not None:
            return self.packed(normalized["obs"], rnn_state, deterministic, generator)
        return self.model.forward_step(normalized, rnn_state, deterministic, generator)

    def published_tensors(self) -> list[torch.Tensor]:
        """Every tensor inference needs, in a fixed order (parameters, then buffers)."""
        return [*self.parameters(), *(b for b in self.buffers())]


def build_policy(params: DataPathParams) -> Policy:
    """A fresh policy for the run's environment."""
    return Policy(env_spec(params.env, **params.env_kwargs), params)


def published_size(params: DataPathParams) -> int:
    """Length of the flat weights vector of a policy built from ``params``."""
    return sum(t.numel() for t in build_policy(params).published_tensors())
