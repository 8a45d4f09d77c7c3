"""Actor-critic models: encoders, recurrent core, action distributions, the observation and
returns normalizers, and the policy built from an env's spec and a model config."""

from sfbus_components.models.actor_critic import ActorCritic, StepOutput
from sfbus_components.models.config import ModelConfig
from sfbus_components.models.distributions import ActionDistribution

__all__ = ["ActionDistribution", "ActorCritic", "ModelConfig", "StepOutput"]
