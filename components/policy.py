"""The policy as the learner trains it and inference workers run it: model plus normalizer."""

from __future__ import annotations

import math

import torch
from torch import nn

from components.algo import ObsNormalizer
from components.config import DataPathParams
from components.envs import EnvSpec, env_spec
from components.models import ActorCritic


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

    def published_tensors(self) -> list[torch.Tensor]:
        """Every tensor inference needs, in a fixed order (parameters, then buffers)."""
        return [*self.parameters(), *(b for b in self.buffers())]


def build_policy(params: DataPathParams) -> Policy:
    """A fresh policy for the run's environment."""
    return Policy(env_spec(params.env, **params.env_kwargs), params)


def published_size(params: DataPathParams) -> int:
    """Length of the flat weights vector of a policy built from ``params``."""
    return sum(t.numel() for t in build_policy(params).published_tensors())
