"""Actor-critic models: encoders, recurrent core, action distributions."""

from components.models.actor_critic import ActorCritic, StepOutput
from components.models.config import ModelConfig
from components.models.distributions import ActionDistribution

__all__ = ["ActionDistribution", "ActorCritic", "ModelConfig", "StepOutput"]
