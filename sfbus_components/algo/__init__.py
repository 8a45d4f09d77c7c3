"""APPO: V-trace, GAE, PPO losses and the combined loss."""

from sfbus_components.algo.appo import appo_loss, gae_targets
from sfbus_components.algo.gae import gae
from sfbus_components.algo.ppo import (
    AppoConfig,
    entropy_loss,
    impala_policy_loss,
    masked_mean,
    masked_std_mean,
    normalize_advantages,
    policy_loss,
    value_loss,
)
from sfbus_components.algo.vtrace import vtrace

__all__ = [
    "AppoConfig",
    "appo_loss",
    "entropy_loss",
    "gae",
    "gae_targets",
    "impala_policy_loss",
    "masked_mean",
    "masked_std_mean",
    "normalize_advantages",
    "policy_loss",
    "value_loss",
    "vtrace",
]
