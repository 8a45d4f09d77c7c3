"""Actor-critic models: encoders, recurrent core, action distributions."""

from sfbus_components.models.actor_critic import ActorCritic, StepOutput
from sfbus_components.models.config import ModelConfig
from sfbus_components.models.distributions import ActionDistribution

__all__ = ["ActionDistribution", "ActorCritic", "ModelConfig", "StepOutput"]
