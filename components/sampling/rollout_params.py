"""The rollout worker's parameters: the data-path settings plus its own (sampling and faults)."""

from __future__ import annotations

from dataclasses import dataclass

from components.datapath.settings import DataPathParams


@dataclass(frozen=True)
class RolloutParams(DataPathParams):
    """Parameters of a rollout worker: the data-path settings plus its own."""

    policy: int = 0
    """The policy every agent of this worker acts with when ``num_policies`` is 1."""
    policy_mapping: str = "components.sampling.policy_mapping:RandomMapping"
    """With ``num_policies`` > 1: the class (``module:Class``) choosing each agent's policy at
    its episode starts (see :mod:`components.sampling.policy_mapping`)."""
    progress_interval_s: float = 1.0
    """Seconds between ``rollout_progress`` reports to the stats actor."""
    inference_timeout_s: float = 3.0
    """A split whose actions did not come within this many seconds (up to twice as many) sends
    its request again: the inference worker may have died with it."""
    env_step_timeout_s: float = 10.0
    """An env step running longer is aborted and the env recreated (0: no watchdog); keep it
    under the run's ``heartbeat_timeout_s``."""
    env_recreate_attempts: int = 5
    """Tries to recreate a failed env (backing off 0.1, 0.2, 0.4 ... s) before the worker's
    process gives up (exit 1: the supervisor restarts it)."""
    max_env_failures_per_minute: int = 60
    """More env failures than this within a minute end the worker's process (exit 1): envs that
    keep failing are not sampled around forever."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("env_recreate_attempts", "max_env_failures_per_minute"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("progress_interval_s", "inference_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.env_step_timeout_s < 0:
            raise ValueError(f"env_step_timeout_s must be >= 0, got {self.env_step_timeout_s}")
