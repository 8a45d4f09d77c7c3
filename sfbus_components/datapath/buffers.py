"""Shared-memory layouts of the data path: trajectory buffers and published policy weights.

Every rollout worker owns one trajectory buffer, ``<worker>.traj.<field>``, each field shaped
``[slots, T+1, ...]``: step ``t`` holds the observation and RNN state the action at ``t`` was
computed from, that action, its log-probability and value, the reward and done that followed (and
whether that done was a time limit's truncation rather than a termination), the policy id and
version that acted, and whether the agent was inactive (did not act). Step ``T`` holds the
observation (and state) after the last action, for bootstrapping; it is also copied into step 0
of the worker's next slot.

With ``agent_policies`` (heterogeneous agents, :mod:`sfbus_components.datapath.agent_policies`)
the fields an agent's spaces shape, its observations, actions and action parameters, are each
policy's own, ``<worker>.policy<id>.traj.<field>`` shaped by that policy's spec, while the rest
(RNN state, rewards, dones, ...), the request table, the slot pool and the stages stay the
worker's: a slot's row is filled in the arrays of the policy its agent acts with (fixed for the
run), and a reader of policy ``p`` sees the buffer through ``TrajectoryLayout.of_policy(p)``.
Every policy's arrays span all the worker's slots, so one pool serves them all.

With ``sampling: batched`` the fields are shaped ``[blocks, T+1, rows, ...]`` instead (a block is
the ``rows_per_split`` slots one split fills, see :mod:`sfbus_components.sampling.batched_layout`):
slot ``s`` is ``(s // rows, :, s % rows)``, so a split's rows at step ``t`` are one contiguous
array. Code that reads or writes slots goes through :meth:`TrajectoryBuffer.at` and
:meth:`TrajectoryBuffer.slot_source`, which know both layouts.

A policy's weights live in ``policy.<id>.weights`` (one flat float32 vector of the model's and the
observation normalizer's state) behind a seqlock counter ``policy.<id>.version``: the learner
makes it odd while writing, even when done; a reader retries if it saw an odd value or the value
changed under it. The published version number is ``counter // 2``.

Every shared array of the data path is named by a function of this module and nowhere else
(``weights_name``, ``pool_name``, ...): the actors, the slot stages and the run record ask here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import torch

from sfbus import ActorContext, ArraySpec, SlotPool
from sfbus_components.datapath.agent_policies import resolve_agent_policies
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.datapath.slot_source import SlotSource
from sfbus_components.envs import EnvSpec, env_spec

Index = int | slice | np.ndarray
"""Slots or steps of a trajectory buffer: one, a range, or an integer array."""
STEP_FIELDS = ("rnn", "actions", "log_probs", "action_params", "values", "rewards", "dones",
               "time_outs", "versions", "policies", "inactive")


def trajectory_field_name(worker: str, field: str, policy: int = -1) -> str:
    """The shared array of one field of the trajectory buffer of rollout worker ``worker``
    (``policy`` >= 0: that policy's own array of a field its agents' spaces shape)."""
    if policy >= 0:
        return f"{worker}.policy{policy}.traj.{field}"
    return f"{worker}.traj.{field}"


def spaced(field: str) -> bool:
    """Whether the agents' spaces shape field ``field`` (each policy's own with
    ``agent_policies``)."""
    return field.startswith("obs.") or field in ("actions", "action_params")


def requests_name(worker: str) -> str:
    """The request table of ``worker``: the rows each split's inference request names."""
    return f"{worker}.requests"


def pool_name(worker: str) -> str:
    """The slot pool of ``worker``'s trajectory buffer."""
    return f"{worker}.pool"


def stage_name(worker: str) -> str:
    """The stage of each slot of ``worker`` (:mod:`sfbus_components.datapath.slot_stages`)."""
    return f"{worker}.stage"


def stage_meta_name(worker: str) -> str:
    """The policy and batcher epoch each slot of ``worker`` was submitted with."""
    return f"{worker}.stage_meta"


def weights_name(policy: int) -> str:
    """The published weights vector of ``policy``."""
    return f"policy.{policy}.weights"


def version_name(policy: int) -> str:
    """The seqlock counter of the weights of ``policy``."""
    return f"policy.{policy}.version"


def batcher_starts_name(policy: int) -> str:
    """The count of starts of the batcher of ``policy`` (its epoch is the count - 1)."""
    return f"policy.{policy}.batcher_starts"


def totals_name(stats_actor: str) -> str:
    """The run's env frames and start time, kept by the statistics actor ``stats_actor``."""
    return f"{stats_actor}.totals"


def stage_array_specs(worker: str, slots: int) -> list[ArraySpec]:
    """The shared arrays tracking the stage of each of a worker's ``slots`` slots."""
    return [ArraySpec(stage_name(worker), (slots,), "uint8"),
            ArraySpec(stage_meta_name(worker), (slots, 2), "int64")]


def batcher_starts_spec(policy: int) -> ArraySpec:
    """The shared counter of the starts of ``policy``'s batcher."""
    return ArraySpec(batcher_starts_name(policy), (1,), "int64")


def totals_spec(stats_actor: str) -> ArraySpec:
    """The shared totals of the statistics actor ``stats_actor``: env frames, start time."""
    return ArraySpec(totals_name(stats_actor), (2,), "int64")


@dataclass(frozen=True)
class TrajectoryLayout:
    """Shapes of one rollout worker's trajectory buffer and request table."""

    spec: EnvSpec
    rollout: int
    state_size: int
    slots: int
    splits: int
    rows_per_split: int
    block_rows: int = 0
    """Rows per block of the ``[blocks, T+1, rows, ...]`` layout (batched sampling); 0 for the
    ``[slots, T+1, ...]`` layout."""
    agent_policies: tuple[int, ...] = ()
    """With ``agent_policies``: the policy of each of an env's agents, fixed for the run."""
    policy_specs: tuple[EnvSpec, ...] = ()
    """With ``agent_policies``: each policy's spec (its agents' spaces, ``num_agents`` their
    count per env), which shapes its own observation and action arrays."""
    policy: int = -1
    """The policy whose view this is (:meth:`of_policy`); -1, the worker's view, has no
    observation and action arrays when ``policy_specs`` is set."""

    def of_policy(self, policy: int) -> TrajectoryLayout:
        """The layout as the readers of ``policy`` see it (itself without ``policy_specs``)."""
        if not self.policy_specs:
            return self
        return replace(self, spec=self.policy_specs[policy], policy=policy)

    def array_name(self, worker: str, field: str) -> str:
        """The shared array that holds field ``field`` of worker ``worker`` in this view."""
        return trajectory_field_name(worker, field, self.policy if spaced(field) else -1)

    def field_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Field name to (shape, dtype); observation fields are named ``obs.<key>``."""
        rows = self.block_rows
        if rows and self.slots % rows:
            raise ValueError(f"{self.slots} slots are not whole blocks of {rows}")
        steps = (self.slots // rows, self.rollout + 1, rows) if rows else (self.slots,
                                                                         self.rollout + 1)
        fields = {f"obs.{k}": ((*steps, *f.shape), f.dtype)
                  for k, f in self.spec.observation_space.items()}
        fields.update({
            # A zero-width state would be an empty segment; keep one unused column instead.
            "rnn": ((*steps, max(self.state_size, 1)), "float32"),
            "actions": ((*steps, *self.spec.action_shape), self.spec.action_dtype),
            "log_probs": (steps, "float32"),
            # the behaviour distribution (logits, or mean and log-std): the KL terms' mu
            "action_params": ((*steps, self.spec.action_params_size), "float32"),
            "values": (steps, "float32"),
            "rewards": (steps, "float32"),
            "dones": (steps, "uint8"),
            "time_outs": (steps, "uint8"),  # the done was a truncation (value_bootstrap)
            "versions": (steps, "int64"),
            "policies": (steps, "int64"),
            # 1: the agent did not act at this step (a multi-agent env's `is_active` False),
            # masked out of the loss as a step of another policy; 0 (the buffer's zeros) acted
            "inactive": (steps, "uint8"),
        })
        if self.policy_specs and self.policy < 0:  # each policy's own: see of_policy
            return {name: value for name, value in fields.items() if not spaced(name)}
        return fields

    def array_specs(self, worker: str) -> list[ArraySpec]:
        """Every shared array of worker ``worker``: buffer fields, request table, slot pool and
        the pool's slot stages (see :mod:`sfbus_components.datapath.slot_stages`)."""
        specs = [ArraySpec(self.array_name(worker, name), shape, dtype)
                 for name, (shape, dtype) in self.field_shapes().items()]
        for policy in range(len(self.policy_specs)):
            view = self.of_policy(policy)
            specs.extend(ArraySpec(view.array_name(worker, name), shape, dtype)
                         for name, (shape, dtype) in view.field_shapes().items() if spaced(name))
        specs.append(ArraySpec(requests_name(worker), (self.splits, self.rows_per_split, 2),
                               "int64"))
        specs.extend(SlotPool.array_specs(pool_name(worker), self.slots))
        specs.extend(stage_array_specs(worker, self.slots))  # who holds each slot (recovery)
        return specs


def trajectory_layout(params: DataPathParams, workers: int) -> TrajectoryLayout:
    """The layout every worker's buffer has in a run of ``workers`` rollout workers, with its
    slot count (computed once per run, in :class:`sfbus_components.datapath.record.DataPath`).

    Async: one slot per agent being filled, plus enough spare slots for
    ``num_batches_to_accumulate`` batches spread over the workers; when they run out, collection
    pauses (the back-pressure). With a population that is per policy, since each policy's batcher
    fills its own batches. With 0 spare batches an agent's next trajectory waits for the learner
    to copy its last, so a batch must fit in the trajectories of all agents at once. Sync: exactly
    the slots one batch takes from this worker, released only after training, so collection stops
    while the learner trains (one policy only).
    """
    spec = env_spec(params.env, **params.env_kwargs)
    agent_policies, policy_specs = resolve_agent_policies(spec, params.agent_policies,
                                                          params.num_policies)
    agents = params.num_envs * spec.num_agents
    per_batch = params.trajectories_per_batch
    if params.mode == "sync":
        if params.acting_policies > 1:
            raise ValueError("sync mode trains one policy against itself; use mode async with "
                             "num_policies > 1 or opponent_slots")
        if per_batch % (workers * agents):
            raise ValueError(
                f"sync mode: batch_size {params.batch_size} must be a multiple of rollout x "
                f"agents = {params.rollout} x {workers * agents} (every agent of every worker "
                f"contributes the same number of trajectories)")
        slots = per_batch // workers
    else:
        if params.num_batches_to_accumulate == 0 and per_batch > workers * agents:
            raise ValueError(
                f"num_batches_to_accumulate 0 keeps one trajectory per agent, but a batch of "
                f"{params.batch_size} samples takes {per_batch} trajectories and the run has "
                f"{workers * agents} agents: lower batch_size or raise num_batches_to_accumulate")
        slots = agents + math.ceil(
            params.num_policies * params.num_batches_to_accumulate * per_batch / workers)
    rows_per_split = agents // params.num_splits
    batched = params.sampling == "batched"
    if batched and params.mode == "async":
        # Splits take whole blocks of rows_per_split slots
        # (sfbus_components.sampling.batched_layout): round up to whole blocks, plus one for the
        # block a batch boundary leaves partly released.
        slots = (math.ceil(slots / rows_per_split) + 1) * rows_per_split
    return TrajectoryLayout(spec, params.rollout, params.state_size, slots, params.num_splits,
                            rows_per_split, rows_per_split if batched else 0, agent_policies,
                            policy_specs)


class TrajectoryBuffer:
    """A rollout worker's trajectory buffer, attached in any process: numpy and torch views."""

    def __init__(self, context: ActorContext, worker: str, layout: TrajectoryLayout) -> None:
        self.context = context
        self.worker = worker
        self.layout = layout
        self.numpy: dict[str, np.ndarray] = {}
        self.torch: dict[str, torch.Tensor] = {}
        for name in layout.field_shapes():
            array = context.shared(layout.array_name(worker, name))
            self.numpy[name] = array.numpy
            self.torch[name] = array.torch
        # none in a heterogeneous worker's own view: each policy's view has its own
        self.obs_keys = tuple(k for k in layout.spec.observation_space
                              if f"obs.{k}" in self.numpy)
        requests = context.shared(requests_name(worker))
        self.requests = requests.numpy

    def of_policy(self, policy: int) -> TrajectoryBuffer:
        """The buffer as policy ``policy`` sees it (:meth:`TrajectoryLayout.of_policy`)."""
        return TrajectoryBuffer(self.context, self.worker, self.layout.of_policy(policy))

    def obs_numpy(self) -> dict[str, np.ndarray]:
        """Observation fields by key (without the ``obs.`` prefix), numpy views."""
        return {k: self.numpy[f"obs.{k}"] for k in self.obs_keys}

    def obs_torch(self) -> dict[str, torch.Tensor]:
        """Observation fields by key, torch views over the same bytes."""
        return {k: self.torch[f"obs.{k}"] for k in self.obs_keys}

    def at(self, slots: Index, t: Index) -> tuple[Index, ...]:
        """Where rows ``slots`` at step(s) ``t`` lie in any field (numpy or torch, read or write).

        ``slots`` and ``t`` are ints, slices or integer arrays; the result's leading axes are
        ``[slots, t]`` whatever the layout. In the block layout it indexes a view (one contiguous
        array) when ``slots`` is an int, or a slice inside one block and ``t`` an int.
        """
        rows = self.layout.block_rows
        if not rows:
            return slots, t
        if isinstance(slots, slice):
            n = slots.stop - slots.start
            if isinstance(t, (int, np.integer)):
                block, first = divmod(slots.start, rows)
                if first + n > rows:
                    raise ValueError(f"slots {slots.start}..{slots.stop - 1} span two blocks")
                return block, t, slice(first, first + n)
            slots = np.arange(slots.start, slots.stop)  # keeps the [slots, t] axis order
        return slots // rows, t, slots % rows

    def slot_source(self, name: str, steps: int | None, width: int | None = None) -> SlotSource:
        """What a batch copies of field ``name``: steps ``[0, steps)`` of a slot (``None``: step
        0 alone, without a step axis), its trailing axis cut to ``width`` if given."""
        field = self.torch[name]
        if width is not None:
            field = field[..., :width]
        return SlotSource(field, self.layout.block_rows, self.layout.rollout + 1, steps)


def policy_array_specs(policy: int, num_params: int) -> list[ArraySpec]:
    """The shared arrays that publish the weights of ``policy``."""
    return [ArraySpec(weights_name(policy), (num_params,), "float32"),
            ArraySpec(version_name(policy), (1,), "int64")]


def flat_size(tensors: Iterable[torch.Tensor]) -> int:
    """Number of float elements in ``tensors`` (the weights vector's length)."""
    return sum(t.numel() for t in tensors)


_PAGE_LOCKED: set[int] = set()
"""Addresses of weights vectors this process registered with CUDA (registering twice fails)."""


class PolicyWeights:
    """The published weights of one policy: the learner writes, inference workers read."""

    def __init__(self, context: ActorContext, policy: int) -> None:
        self.policy = policy
        self.weights = context.shared(weights_name(policy)).torch
        self.counter = context.shared(version_name(policy)).numpy
        self.page_locked = False
        """Whether :meth:`page_lock` registered the vector with CUDA in this process."""

    def page_lock(self) -> bool:
        """Register the weights vector with CUDA as page-locked memory (once per process), so
        that a GPU copies to and from it in one DMA at full speed: measured on an H100, a
        version costs the learner ~10 ms and an inference worker ~7 ms through pageable memory
        (``python -m bench.gpu_weights``). False where that is not possible."""
        if self.page_locked or not torch.cuda.is_available():
            return self.page_locked
        address = self.weights.data_ptr()
        if address not in _PAGE_LOCKED:  # an actor beside us in this process registered it
            cudart = torch.cuda.cudart()
            code = cudart.cudaHostRegister(
                address, self.weights.numel() * self.weights.element_size(), 0)
            if int(getattr(code, "value", code)) != 0:
                # The runtime keeps the error for the next kernel launch to report: clear it.
                getattr(cudart, "cudaGetLastError", lambda: None)()
                return False
            _PAGE_LOCKED.add(address)
        self.page_locked = True
        return True

    @property
    def version(self) -> int:
        """The last completely published version (0 before the first publish)."""
        return int(self.counter[0]) // 2

    def publish(self, tensors: list[torch.Tensor], version: int) -> None:
        """Write ``tensors`` (in a fixed order) as ``version``; readers never see half of it."""
        with torch.no_grad():
            if tensors and tensors[0].device.type != "cpu":
                # A GPU learner: one flat vector on the device, then one transfer down (into
                # page-locked memory where possible), instead of a small transfer per tensor.
                self.page_lock()
                tensors = [torch.cat([t.reshape(-1).float() for t in tensors])]
            self.counter[0] = 2 * version - 1  # odd: writing
            offset = 0
            for tensor in tensors:
                n = tensor.numel()
                self.weights[offset:offset + n].copy_(tensor.reshape(-1))
                offset += n
        self.counter[0] = 2 * version

    def read_into(self, tensors: list[torch.Tensor]) -> int:
        """Copy the published weights into ``tensors``; returns the version read."""
        while True:
            before = int(self.counter[0])
            if before % 2:
                continue  # the learner is mid-write; it takes well under a millisecond
            offset = 0
            with torch.no_grad():
                for tensor in tensors:
                    n = tensor.numel()
                    tensor.copy_(self.weights[offset:offset + n].view_as(tensor))
                    offset += n
            if int(self.counter[0]) == before:
                return before // 2
