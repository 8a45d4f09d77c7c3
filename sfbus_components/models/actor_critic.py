"""The actor-critic network: encoder -> core (GRU | LSTM | none | a user's) -> decoder MLP -> actor
and critic heads; with separate weights, the critic has its own encoder, core and decoder."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sfbus_components.envs.spec import ACTION_MASK_KEY
from sfbus_components.models.config import ModelConfig
from sfbus_components.models.core import Core
from sfbus_components.models.distributions import ActionDistribution, HybridDistribution
from sfbus_components.models.encoders import EncoderRunner, ObsEncoder, mlp
from sfbus_components.models.gaussian_head import GaussianHead
from sfbus_components.models.parts import build_core, build_encoder
from sfbus_components.models.registry import model_state_size
from sfbus_components.models.threaded_sequence import sequence_in_threads

CoreStep = Callable[[nn.Module, Tensor, Tensor], tuple[Tensor, Tensor]]
"""Runs one step of a core: ``(core, x [B, in], state [B, S]) -> (out, new_state)``."""


def _core_step(core: nn.Module, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """The core's own ``step``."""
    return core.step(x, state)


@dataclass(frozen=True)
class StepOutput:
    """What one inference step returns, one row per environment."""

    actions: Tensor
    """int64 `[B, num_heads]` for categorical heads, float `[B, action_dim]` for a Gaussian,
    float `[B, num_heads + action_dim]` for both (hybrid)."""
    log_prob: Tensor
    """`[B]` log mu(a|x) of the returned actions, summed over heads."""
    value: Tensor
    """`[B]` critic output (in normalized-return space when returns are normalized)."""
    rnn_state: Tensor
    """`[B, state_size]` state to store and feed with the next step."""
    action_logits: Tensor
    """The distribution's parameters: `[B, sum(action_heads)]` logits, then the Gaussian's mean
    and log-std `[B, 2 * action_dim]`."""


class ActorCritic(nn.Module):
    """Encoder -> core -> heads: by default the paper's model (supplement A.1.3, Figure A.1),
    else the encoder and core the config names (docs/MODELS.md)."""

    sequence_threads: int = 1
    """Threads :meth:`forward_sequence` splits the trajectories over, forward and backward
    (:mod:`sfbus_components.models.threaded_sequence`); the learner sets it on a CPU."""

    def __init__(
        self,
        obs_spec: dict[str, tuple[tuple[int, ...], str]],
        action_heads: tuple[int, ...] | None,
        action_dim: int | None,
        cfg: ModelConfig,
    ) -> None:
        super().__init__()
        if action_heads is None and action_dim is None:
            raise ValueError("give action_heads (categorical), action_dim (Box) or both (hybrid)")
        self.cfg = cfg
        self.action_heads = tuple(action_heads) if action_heads is not None else None
        self.action_dim = action_dim
        # Built-in or the user's (docs/MODELS.md), by name or import path: the one door
        self.encoder = build_encoder(obs_spec, cfg)
        self.core = build_core(self.encoder.out_size, cfg)
        self.decoder = mlp(self.core.out_size, cfg.decoder_mlp_layers, cfg.nonlinearity)
        if isinstance(self.core, Core):  # a built-in core computes as the encoder does
            self.core.products_precision = self.encoder.precision
        # Separate weights: the critic's own encoder -> core -> decoder, its state after the
        # actor's in the flat state (Sample Factory's ActorCriticSeparateWeights).
        self.critic_encoder: EncoderRunner | None = None
        self.critic_core: nn.Module | None = None
        self.critic_decoder: nn.Module | None = None
        if not cfg.actor_critic_share_weights:
            self.critic_encoder = build_encoder(obs_spec, cfg)
            self.critic_core = build_core(self.critic_encoder.out_size, cfg)
            if isinstance(self.critic_core, Core):
                self.critic_core.products_precision = self.critic_encoder.precision
            self.critic_decoder = mlp(self.core.out_size, cfg.decoder_mlp_layers,
                                      cfg.nonlinearity)
        self._state_size = model_state_size(cfg)
        head_size = cfg.decoder_mlp_layers[-1] if cfg.decoder_mlp_layers else self.core.out_size
        # One fused Linear for all categorical heads: the same as one Linear per head (its rows
        # split per head), in one matmul.
        self.actor: nn.Linear | GaussianHead = (
            nn.Linear(head_size, sum(self.action_heads))
            if self.action_heads is not None
            else GaussianHead(head_size, action_dim, cfg))
        self.critic = nn.Linear(head_size, 1)
        self._init_weights()
        # A hybrid action's Box: a Gaussian head beside the categorical one (it initialises
        # itself, as the Gaussian actor does)
        self.actor_box = (GaussianHead(head_size, action_dim, cfg)
                          if self.action_heads is not None and action_dim is not None else None)

    def _init_weights(self) -> None:
        # Orthogonal init: sqrt(2) gain for hidden layers, unit gain for the critic and for the
        # actor head, as Sample Factory (policy_init_gain=1). A CleanRL-style 0.01 actor head kept
        # doom_basic's policy at exactly uniform: entropy 1.3863 -> 1.3775 after 90 updates even
        # with per-pixel input normalization, where gain 1 learns (mean reward +38 at ~370k
        # frames): the small head scales the policy gradient reaching the core and encoder by 0.01.
        # A user's encoder and core keep their own initialization.
        scheme = self.cfg.policy_initialization
        if scheme == "torch_default":
            # as Sample Factory: PyTorch's weights, zero biases (the RNN untouched)
            for module in self.modules():
                if isinstance(module, nn.Linear | nn.Conv2d) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            if isinstance(self.actor, GaussianHead):
                self.actor.reset_parameters()
            return
        init = nn.init.orthogonal_ if scheme == "orthogonal" else nn.init.xavier_uniform_
        # Sample Factory's scheme when its gain is given: one gain everywhere, torch's RNN init
        as_sample_factory = self.cfg.policy_init_gain is not None
        hidden_gain = self.cfg.policy_init_gain if as_sample_factory else math.sqrt(2.0)
        head_gain = self.cfg.policy_init_gain if as_sample_factory else 1.0
        hidden = [self.decoder, self.critic_decoder,
                  *(e for e in (self.encoder, self.critic_encoder) if isinstance(e, ObsEncoder))]
        for part in hidden:
            for module in part.modules() if part is not None else ():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    init(module.weight, gain=hidden_gain)
                    nn.init.zeros_(module.bias)
        for core in (self.core, self.critic_core):
            if isinstance(core, Core) and core.rnn is not None and not as_sample_factory:
                for name, param in core.rnn.named_parameters():
                    if name.startswith("weight"):
                        init(param)
                    else:
                        nn.init.zeros_(param)
        if isinstance(self.actor, GaussianHead):
            self.actor.reset_parameters()
        else:
            init(self.actor.weight, gain=head_gain)
            nn.init.zeros_(self.actor.bias)
        init(self.critic.weight, gain=head_gain)
        nn.init.zeros_(self.critic.bias)

    @property
    def state_size(self) -> int:
        """Width of the flat RNN state (0 without a core)."""
        return self._state_size

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> Tensor:
        """Zeros `[batch_size, state_size]`: the state at the start of an episode."""
        return torch.zeros(batch_size, self.state_size, device=device)

    def distribution(self, core_out: Tensor,
                     action_mask: Tensor | None = None) -> ActionDistribution:
        """The action distribution for core outputs of any leading shape, with the actions
        ``action_mask`` (same leading shape) marks as not allowed masked out."""
        if self.action_heads is None:
            return self.actor(core_out)
        heads = ActionDistribution(logits=self.actor(core_out), action_heads=self.action_heads,
                                   action_mask=action_mask)
        return heads if self.actor_box is None else HybridDistribution(heads,
                                                                       self.actor_box(core_out))

    def forward_step(
        self, obs: dict[str, Tensor], rnn_state: Tensor, deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> StepOutput:
        """One inference step for `B` environments; `rnn_state` must already be zero at an
        episode start (this never resets it). Actions are sampled from `generator`."""
        core_out, critic_core_out, new_state = self.core_step(obs, rnn_state)
        return self.act(core_out, new_state, deterministic, generator,
                        obs.get(ACTION_MASK_KEY), critic_core_out)

    def core_step(self, obs: dict[str, Tensor], rnn_state: Tensor,
                  step: CoreStep | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
        """Encoder and core of one step: (the actor's core output, the critic's or None when
        they share weights, the new flat state). ``step(core, x, state)`` runs a core (default:
        its ``step``; the ONNX export passes the cell equations)."""
        step = step or _core_step
        if self.critic_encoder is None:
            out, state = step(self.core, self.encoder(obs), rnn_state)
            return out, None, state
        half = self.state_size // 2
        out, state = step(self.core, self.encoder(obs), rnn_state[:, :half])
        critic_out, critic_state = step(self.critic_core, self.critic_encoder(obs),
                                        rnn_state[:, half:])
        return out, critic_out, torch.cat([state, critic_state], dim=1)

    def head_inputs(self, core_out: Tensor,
                    critic_core_out: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The decoder(s) over core outputs of any leading shape: (actor's, critic's) input."""
        features = self.decoder(core_out)
        if critic_core_out is None or self.critic_decoder is None:
            return features, features
        return features, self.critic_decoder(critic_core_out)

    def act(self, core_out: Tensor, new_state: Tensor, deterministic: bool = False,
            generator: torch.Generator | None = None, action_mask: Tensor | None = None,
            critic_core_out: Tensor | None = None) -> StepOutput:
        """The decoder and heads of one inference step: an action per row of
        `core_out [B, out]`, none of those `action_mask [B, n]` masks (and the critic's core
        output with separate weights)."""
        actor_in, critic_in = self.head_inputs(core_out, critic_core_out)
        dist = self.distribution(actor_in, action_mask)
        actions = dist.mode() if deterministic else dist.sample(generator)
        return StepOutput(
            actions=actions,
            log_prob=dist.log_prob(actions),
            value=self.critic(critic_in).squeeze(-1).float(),
            rnn_state=new_state.float(),
            action_logits=dist.params,
        )

    def forward_sequence(
        self, obs: dict[str, Tensor], rnn_state: Tensor, dones: Tensor
    ) -> tuple[ActionDistribution, Tensor]:
        """BPTT over `[B, T, ...]` obs from `rnn_state [B, S]` (the state entering step 0):
        `dones[:, t]` = episode ended after step t, so the state entering t + 1 is multiplied by
        `1 - dones[:, t]` (the last column is never used); an `action_mask` in `obs` masks each
        step's actions. Returns the distribution over
        `[B, T]` and values `[B, T]`."""
        actor_in, critic_in = sequence_in_threads(self._sequence_trunk, self.sequence_threads,
                                                  obs, rnn_state, dones)
        values = self.critic(critic_in).squeeze(-1).float()
        return self.distribution(actor_in, obs.get(ACTION_MASK_KEY)), values

    def _sequence_trunk(self, obs: dict[str, Tensor], rnn_state: Tensor,
                        dones: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder, core and decoder over `[B, T, ...]`: the heads' inputs (actor's, critic's)."""
        batch, steps = dones.shape[:2]
        flat = {key: value.reshape(batch * steps, *value.shape[2:]) for key, value in obs.items()}
        features = self.encoder(flat).reshape(batch, steps, -1)
        if self.critic_encoder is None:
            core_out, critic_core_out = self.core.sequence(features, rnn_state, dones), None
        else:
            half = self.state_size // 2
            core_out = self.core.sequence(features, rnn_state[:, :half], dones)
            critic_features = self.critic_encoder(flat).reshape(batch, steps, -1)
            critic_core_out = self.critic_core.sequence(critic_features, rnn_state[:, half:],
                                                        dones)
        return self.head_inputs(core_out, critic_core_out)

    def encoders(self) -> list[EncoderRunner]:
        """The encoder, and the critic's own with separate weights."""
        return [e for e in (self.encoder, self.critic_encoder) if e is not None]
