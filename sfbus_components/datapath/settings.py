"""The data path's parameters: the rollout actor's (taken from a topology's ``settings`` by name),
which the run record :class:`~sfbus_components.datapath.record.DataPath` carries to every other
data-path actor."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from sfbus_components.datapath.agent_policies import resolve_agent_policies
from sfbus_components.envs import EnvSpec, env_spec
from sfbus_components.envs.registry import check_installed
from sfbus_components.models import ModelConfig
from sfbus_components.models.policy import Policy
from sfbus_components.models.registry import model_state_size


@dataclass(frozen=True)
class DataPathParams:
    """What every data-path actor must agree on: set once in ``settings``, read by the rollout
    actor, and carried to the others by the run record (``DataPath.params``)."""

    env: str = "doom_basic"
    """Environment name (``doom_<scenario>``, ``gym:<EnvId>``, or ``module:factory``)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment factory (``frameskip``, ``action_space``, ...)."""
    rollout: int = 32
    """T: steps per trajectory, and the BPTT length (Table A.5)."""
    num_envs: int = 16
    """Environments per rollout worker; the paper finds 16-32 per core best for VizDoom."""
    num_splits: int = 2
    """Groups a worker's environments are split into; 2 is double-buffered sampling."""
    batch_size: int = 2048
    """Samples (agent steps) per training batch (Table A.5)."""
    mode: Literal["async", "sync"] = "async"
    """``async`` keeps collecting while the learner trains; ``sync`` pauses collection."""
    num_batches_to_accumulate: int = 2
    """Async mode: batches that may wait for the learner before collection pauses. 0: none,
    an agent starts its next trajectory once the learner has copied its last (one slot per
    agent; one policy only): where the learner is the bottleneck, waiting batches only age the
    data, and this gives the least policy lag."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The actor-critic network."""
    seed: int = 0
    """Base seed; each worker and environment derives its own from it."""
    num_policies: int = 1
    """Policies trained side by side (a population); each has its own learner and batcher."""
    opponent_slots: int = 0
    """Frozen opponents beside the trained policies: policy ids ``num_policies ..
    num_policies + opponent_slots - 1`` that act but never train, served by the inference
    workers with the weights a league loads into them (:mod:`sfbus_components.league`)."""
    sampling: Literal["non_batched", "batched"] = "non_batched"
    """``batched``: each split's slots are one contiguous block, so the inference worker runs on
    a slice of the buffer with no gather (one policy only, see
    :mod:`sfbus_components.sampling.batched_layout`)."""
    agent_policies: dict[str, int] = field(default_factory=dict)
    """Agent name (or ``fnmatch`` pattern, first match wins) -> the policy that acts for it for
    the whole run, each policy with its agents' own observation and action spaces, model and
    arrays (:mod:`sfbus_components.datapath.agent_policies`); needed where an env's agents
    differ in space (``{"adversary_*": 0, "agent_*": 1}``). Empty: every agent shares the
    env's one space and the rollout's ``policy_mapping`` picks its policy per episode."""

    def __post_init__(self) -> None:
        # First, and naming the field first: a topology's error then points at its `env:` line
        check_installed(self.env)
        for name in ("rollout", "num_envs", "num_splits", "batch_size", "num_policies"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.opponent_slots < 0:
            raise ValueError(f"opponent_slots must be >= 0, got {self.opponent_slots}")
        if self.num_batches_to_accumulate < 0:
            raise ValueError(f"num_batches_to_accumulate must be >= 0, got "
                             f"{self.num_batches_to_accumulate}")
        if self.num_batches_to_accumulate == 0 and self.acting_policies > 1:
            # a policy's batch could wait forever for slots that hold the others' trajectories
            raise ValueError(f"num_batches_to_accumulate 0 trains one policy, but "
                             f"{self.acting_policies} act (num_policies + opponent_slots); give "
                             f"each policy's batches room (>= 1)")
        if not 0 <= self.seed < 2**63:  # what numpy's and torch's generators take
            raise ValueError(f"seed must be >= 0 and below 2**63, got {self.seed}")
        if self.num_envs % self.num_splits:
            raise ValueError(f"num_envs ({self.num_envs}) must be divisible by num_splits "
                             f"({self.num_splits})")
        if self.sampling == "batched" and self.acting_policies > 1:
            raise ValueError(f"sampling: batched runs one policy per worker, but "
                             f"{self.acting_policies} act (num_policies + opponent_slots); use "
                             f"sampling: non_batched for a population or a league")
        if self.agent_policies and self.opponent_slots:
            raise ValueError("agent_policies gives each policy its agents' own spaces, but a "
                             "league's opponent slots (opponent_slots) are served with one "
                             "model for all; use one or the other")
        if self.agent_policies and self.num_policies == 1:
            raise ValueError("agent_policies maps agents to policies, but num_policies is 1 "
                             "(every agent acts with policy 0 already)")
        for key, policy in self.agent_policies.items():
            if not 0 <= policy < self.num_policies:
                raise ValueError(f"agent_policies: {key!r} maps to policy {policy}, but the run "
                                 f"has policies 0..{self.num_policies - 1} (num_policies)")
        if self.batch_size % self.rollout:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of rollout "
                             f"({self.rollout})")

    def launch_notes(self, topology: Any) -> list[str]:
        """The notes ``sfbus validate`` and ``run`` print once: the settings given whose names
        Sample Factory uses for something else (:mod:`sfbus_components.datapath.shared_names`)."""
        from sfbus_components.datapath.shared_names import shared_name_notes

        return shared_name_notes(topology.document)

    @property
    def acting_policies(self) -> int:
        """Policy ids that act: the trained ones, then the opponent slots."""
        return self.num_policies + self.opponent_slots

    @property
    def trajectories_per_batch(self) -> int:
        """Trajectories of T steps in one training batch."""
        return self.batch_size // self.rollout

    @property
    def state_size(self) -> int:
        """Width of the flat RNN state (an LSTM keeps h and c), as the model's core says."""
        return model_state_size(self.model)


def data_path_params(params: DataPathParams) -> DataPathParams:
    """The data-path fields of ``params`` alone (the rollout actor's ``Params`` add their own)."""
    return DataPathParams(**{f.name: getattr(params, f.name) for f in fields(DataPathParams)})


def policy_spec(params: DataPathParams, policy: int = 0) -> EnvSpec:
    """The spec of the agents ``policy`` acts for: the env's, or with ``agent_policies`` that
    policy's own (its agents' spaces and count)."""
    spec = env_spec(params.env, **params.env_kwargs)
    if not params.agent_policies:
        return spec
    return resolve_agent_policies(spec, params.agent_policies, params.num_policies)[1][policy]


def build_policy(params: DataPathParams, policy: int = 0) -> Policy:
    """A fresh network of ``policy`` for the run's environment and model."""
    return Policy(policy_spec(params, policy), params.model)


def published_size(params: DataPathParams, policy: int = 0) -> int:
    """Length of the flat weights vector of ``policy``, built from ``params``."""
    return sum(t.numel() for t in build_policy(params, policy).published_tensors())
