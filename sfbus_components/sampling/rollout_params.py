"""The rollout worker's parameters: the data-path settings plus its own (sampling and faults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sfbus import Interval, Seconds
from sfbus_components.datapath.settings import DataPathParams


@dataclass(frozen=True)
class RolloutParams(DataPathParams):
    """Parameters of a rollout worker: the data-path settings plus its own."""

    policy: int = 0
    """The policy every agent of this worker acts with when ``num_policies`` is 1."""
    policy_mapping: str = "sfbus_components.sampling.policy_mapping:RandomMapping"
    """With ``num_policies`` > 1: the class (``module:Class``) choosing each agent's policy at
    its episode starts (see :mod:`sfbus_components.sampling.policy_mapping`)."""
    policy_mapping_params: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the mapping class (a league's ``latest_ratio``); with
    ``opponent_slots`` the worker adds ``opponent_slots``."""
    progress_interval_s: Interval = 1.0
    """Seconds between ``rollout_progress`` reports to the stats actor."""
    inference_timeout_s: Seconds = 3.0
    """A split whose actions did not come within this many seconds (up to twice as many) sends
    its request again: the inference worker may have died with it."""
    env_step_timeout_s: Seconds = 10.0
    """An env step running longer is aborted and the env recreated (0: no watchdog); keep it
    under the run's ``heartbeat_timeout_s``."""
    env_recreate_attempts: int = 5
    """Tries to recreate a failed env (backing off 0.1, 0.2, 0.4 ... s) before the worker's
    process gives up (exit 1: the supervisor restarts it)."""
    max_env_failures_per_minute: int = 60
    """More env failures than this within a minute end the worker's process (exit 1): envs that
    keep failing are not sampled around forever."""
    decorrelate_envs_on_one_worker: bool = False
    """At start, env ``e`` of a worker takes ``rollout * e`` random actions before its first
    observation is used, so that a worker's envs are at different points of their episodes
    (Sample Factory's option, on by default there; envs with a native batch skip it)."""
    decorrelate_experience_max_seconds: float = 0.0
    """After its first full trajectories, worker ``i`` of ``n`` waits ``i / n`` times this many
    seconds before collecting again, so that the workers' trajectories reach the learner spread
    out in time rather than in bursts (Sample Factory's option; 0: no wait)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("env_recreate_attempts", "max_env_failures_per_minute"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.inference_timeout_s > 0:
            raise ValueError(f"inference_timeout_s must be > 0, got {self.inference_timeout_s}")
        if not 0.0 <= self.decorrelate_experience_max_seconds < float("inf"):
            raise ValueError("decorrelate_experience_max_seconds must be >= 0 and finite, got "
                             f"{self.decorrelate_experience_max_seconds}")
        if self.env_step_timeout_s < 0:
            raise ValueError(f"env_step_timeout_s must be >= 0, got {self.env_step_timeout_s}")
