"""The actor-critic network: encoder -> core (GRU | LSTM | none | a user's) -> actor and critic
heads."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from components.models.config import ModelConfig
from components.models.core import Core
from components.models.distributions import ActionDistribution
from components.models.encoders import ObsEncoder
from components.models.gaussian_head import GaussianHead
from components.models.parts import build_core, build_encoder


@dataclass(frozen=True)
class StepOutput:
    """What one inference step returns, one row per environment."""

    actions: Tensor
    """int64 `[B, num_heads]` for categorical heads, float `[B, action_dim]` for a Gaussian."""
    log_prob: Tensor
    """`[B]` log mu(a|x) of the returned actions, summed over heads."""
    value: Tensor
    """`[B]` critic output (in normalized-return space when returns are normalized)."""
    rnn_state: Tensor
    """`[B, state_size]` state to store and feed with the next step."""
    action_logits: Tensor
    """`[B, sum(action_heads)]` logits, or the `[B, action_dim]` Gaussian mean."""


class ActorCritic(nn.Module):
    """Encoder -> core -> heads: by default the paper's model (supplement A.1.3, Figure A.1),
    else the encoder and core the config names (docs/MODELS.md)."""

    def __init__(
        self,
        obs_spec: dict[str, tuple[tuple[int, ...], str]],
        action_heads: tuple[int, ...] | None,
        action_dim: int | None,
        cfg: ModelConfig,
    ) -> None:
        super().__init__()
        if (action_heads is None) == (action_dim is None):
            raise ValueError("give exactly one of action_heads (categorical) or action_dim (Box)")
        self.cfg = cfg
        self.action_heads = tuple(action_heads) if action_heads is not None else None
        self.action_dim = action_dim
        # Built-in or the user's (docs/MODELS.md), by name or import path: the one door
        self.encoder = build_encoder(obs_spec, cfg)
        self.core = build_core(self.encoder.out_size, cfg)
        self._state_size = type(self.core).state_size_for(cfg)
        # One fused Linear for all categorical heads: the same as one Linear per head (its rows
        # split per head), in one matmul.
        self.actor: nn.Linear | GaussianHead = (
            nn.Linear(self.core.out_size, sum(self.action_heads))
            if self.action_heads is not None
            else GaussianHead(self.core.out_size, action_dim, cfg))
        self.critic = nn.Linear(self.core.out_size, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        # Orthogonal init: sqrt(2) gain for hidden layers, unit gain for the critic and for the
        # actor head, as Sample Factory (policy_init_gain=1). A CleanRL-style 0.01 actor head kept
        # doom_basic's policy at exactly uniform: entropy 1.3863 -> 1.3775 after 90 updates even
        # with per-pixel input normalization, where gain 1 learns (mean reward +38 at ~370k
        # frames): the small head scales the policy gradient reaching the core and encoder by 0.01.
        # A user's encoder and core keep their own initialization.
        if isinstance(self.encoder, ObsEncoder):
            for module in self.encoder.modules():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    nn.init.orthogonal_(module.weight, gain=math.sqrt(2.0))
                    nn.init.zeros_(module.bias)
        if isinstance(self.core, Core) and self.core.rnn is not None:
            for name, param in self.core.rnn.named_parameters():
                if name.startswith("weight"):
                    nn.init.orthogonal_(param)
                else:
                    nn.init.zeros_(param)
        if isinstance(self.actor, GaussianHead):
            self.actor.reset_parameters()
        else:
            nn.init.orthogonal_(self.actor.weight, gain=1.0)
            nn.init.zeros_(self.actor.bias)
        nn.init.orthogonal_(self.critic.weight, gain=1.0)
        nn.init.zeros_(self.critic.bias)

    @property
    def state_size(self) -> int:
        """Width of the flat RNN state (0 without a core)."""
        return self._state_size

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> Tensor:
        """Zeros `[batch_size, state_size]`: the state at the start of an episode."""
        return torch.zeros(batch_size, self.state_size, device=device)

    def distribution(self, core_out: Tensor) -> ActionDistribution:
        """The action distribution for core outputs of any leading shape."""
        if self.action_heads is None:
            return self.actor(core_out)
        return ActionDistribution(logits=self.actor(core_out), action_heads=self.action_heads)

    def forward_step(
        self, obs: dict[str, Tensor], rnn_state: Tensor, deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> StepOutput:
        """One inference step for `B` environments; `rnn_state` must already be zero at an
        episode start (this never resets it). Actions are sampled from `generator`."""
        features = self.encoder(obs)
        core_out, new_state = self.core.step(features, rnn_state)
        return self.act(core_out, new_state, deterministic, generator)

    def act(self, core_out: Tensor, new_state: Tensor, deterministic: bool = False,
            generator: torch.Generator | None = None) -> StepOutput:
        """The heads of one inference step: an action per row of `core_out [B, out]`."""
        dist = self.distribution(core_out)
        actions = dist.mode() if deterministic else dist.sample(generator)
        return StepOutput(
            actions=actions,
            log_prob=dist.log_prob(actions),
            value=self.critic(core_out).squeeze(-1).float(),
            rnn_state=new_state.float(),
            action_logits=dist.params,
        )

    def forward_sequence(
        self, obs: dict[str, Tensor], rnn_state: Tensor, dones: Tensor
    ) -> tuple[ActionDistribution, Tensor]:
        """BPTT over `[B, T, ...]` obs from `rnn_state [B, S]` (the state entering step 0):
        `dones[:, t]` = episode ended after step t, so the state entering t + 1 is multiplied by
        `1 - dones[:, t]` (the last column is never used). Returns the distribution over
        `[B, T]` and values `[B, T]`."""
        batch, steps = dones.shape[:2]
        flat = {key: value.reshape(batch * steps, *value.shape[2:]) for key, value in obs.items()}
        features = self.encoder(flat).reshape(batch, steps, -1)
        core_out = self.core.sequence(features, rnn_state, dones)
        values = self.critic(core_out).squeeze(-1).float()
        return self.distribution(core_out), values
