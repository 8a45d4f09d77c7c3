"""The inference worker: batches rollout workers' requests into one forward pass of a policy.

A request names rows ``(slot, t)`` of a rollout worker's trajectory buffer (its request table
``<worker>.requests[split, :count]``). The worker gathers those rows' observations and RNN states
straight from shared memory, runs the policy once for every request that arrived in the same loop
iteration, writes actions, log-probabilities, values and the policy version back into the same
rows and the new RNN state into row ``t + 1``, then signals each rollout worker. Nothing but
indices travels on the bus. With ``sampling: batched`` a request names a contiguous block of
slots instead, served from a view of it with no gather (see
:mod:`sfbus_components.sampling.batched_layout`). With ``agent_policies`` (heterogeneous agents)
each policy is built from its own spec and reads and writes its rows in its own observation and
action arrays (:mod:`sfbus_components.datapath.buffers`), gathered into buffers of its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sfbus import Actor, Signal, slot
from sfbus_components.datapath.buffers import (
    PolicyWeights,
    TrajectoryBuffer,
    flat_size,
    weights_name,
)
from sfbus_components.datapath.messages import ActionsReady, InferenceRequest, WeightsUpdated
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.settings import build_policy
from sfbus_components.envs import EnvSpec
from sfbus_components.models.device import check_device, describe_device, resolve_device
from sfbus_components.models.policy import Policy
from sfbus_components.sampling.batched_layout import BlockServer

# Rows per forward pass and seconds per batch: powers of two up to a big sampler's whole fleet,
# and 0.1 ms .. 0.25 s (a CPU conv+GRU pass on a few dozen Doom frames takes milliseconds).
_ROW_BUCKETS = tuple(float(2**i) for i in range(12))
_LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25)


class _Rows:
    """Flat views of one rollout worker's buffer, ``[slots * (T+1), ...]``, plus index scratch.

    A row ``(slot, t)`` is ``slot * (T+1) + t`` in these views, so a gather is one
    ``index_select`` and a write-back one numpy assignment per field instead of two-axis fancy
    indexing.
    """

    def __init__(self, buffer: TrajectoryBuffer) -> None:
        layout = buffer.layout
        self.steps = layout.rollout + 1
        self.requests = buffer.requests
        t = buffer.torch
        n = buffer.numpy
        self.obs = {k: t[f"obs.{k}"].flatten(0, 1) for k in buffer.obs_keys}
        self.rnn = t["rnn"].flatten(0, 1)
        # Written through numpy: assigning a few rows costs less per call than index_copy_.
        self.np = {name: n[name].reshape(-1, *n[name].shape[2:])
                   for name in ("rnn", "actions", "log_probs", "action_params", "values",
                                "versions")}
        # One index buffer per split: a split has at most one request in flight (its worker waits
        # for the actions before stepping it again), so reusing it within a batch is safe. It is
        # computed in numpy (a few rows: torch's per-call overhead would dominate); the model's
        # gathers read it through torch.from_numpy, a view of the same memory.
        self.index = np.empty((layout.splits, layout.rows_per_split), np.int64)

    def flat_index(self, split: int, count: int, offset: int = 0) -> np.ndarray:
        """``slot * (T+1) + t`` of the request's rows, in this split's reused index buffer."""
        table = self.requests[split, offset:offset + count]
        index = self.index[split, offset:offset + count]
        np.multiply(table[:, 0], self.steps, out=index)
        np.add(index, table[:, 1], out=index)
        return index


class _Gather:
    """The reused buffers a pass gathers observations and states into, for one observation
    layout: grown (doubling) when too small; pinned for a GPU, whose uploads from them then run
    asynchronously."""

    def __init__(self, rows: _Rows, state_size: int, pin: bool) -> None:
        self.fields = {k: (f.shape[1:], f.dtype) for k, f in rows.obs.items()}
        self.state_size = state_size
        self.pin = pin
        self.capacity = 0
        self.obs: dict[str, Tensor] = {}
        self.rnn = torch.empty(0)

    def views(self, rows: int) -> tuple[dict[str, Tensor], Tensor]:
        """Views of ``rows`` rows of the buffers."""
        if rows > self.capacity:
            self.capacity = max(rows, 2 * self.capacity)
            self.obs = {k: torch.empty((self.capacity, *shape), dtype=dtype, pin_memory=self.pin)
                        for k, (shape, dtype) in self.fields.items()}
            self.rnn = torch.zeros((self.capacity, self.state_size), pin_memory=self.pin)
        return {k: v[:rows] for k, v in self.obs.items()}, self.rnn[:rows]


@dataclass
class _Served:
    """One policy an inference worker serves: its model, published weights and version, and
    its view of the workers' buffers."""

    policy: int
    spec: EnvSpec
    """The spec of the agents it acts for (its own with ``agent_policies``)."""
    rows: list[_Rows]
    """Its rows of every rollout worker's buffer, by worker index."""
    gather: _Gather | None
    """Where its passes gather observations (shared by policies of one layout)."""
    model: Policy | None = None
    weights: PolicyWeights | None = None
    version: int = 0
    used: bool = False
    """A request for it arrived: new weights are then copied as soon as they are published."""


class InferenceWorker(Actor):
    """Serves policies' inference requests from rollout workers' shared trajectory buffers.

    With ``num_policies`` > 1 it serves every policy of the population, one forward pass per
    policy with requests in a loop iteration; rollout workers key requests by policy, so with
    several replicas replica ``r`` serves policies ``r, r + n, ...``.
    """

    component = "inference"
    records = (DataPath,)

    @dataclass(frozen=True)
    class Params:
        """This worker's own knobs; env, model, sizes and seed are the run's data path's
        (``context.records[DataPath].params``)."""

        policy: int = 0
        """The policy this worker serves when ``num_policies`` is 1; requests for another
        policy are a wiring error."""
        random_actions: bool = False
        """Skip the model: draw uniform random actions (Gaussian for a Box), to measure what the
        sampler costs on its own (the paper's "pure sampling" throughput)."""
        deterministic: bool = False
        """Act with the most likely action instead of sampling (evaluation runs)."""
        packed_weights: bool = True
        """Run the model on weights reordered once per refresh for oneDNN, in the eager model's
        precisions, where it allows it (the conv encoder with a GRU or no core, on a CPU; see
        :mod:`sfbus_components.models.packed`); off: the eager model."""
        torch_threads: int = 1
        """Intra-op threads of the forward pass. 1 on small machines: a batch is a few dozen rows,
        too little to split well, and extra threads spin on cores the rollout workers need."""
        device: str = "auto"
        """``auto`` (a GPU when one is visible), ``cpu``, ``cuda`` or ``cuda:N``; without an
        index, the worker of policy (or replica) ``i`` takes GPU ``i mod n``
        (:mod:`sfbus_components.models.device`)."""
        cuda_graphs: bool = False
        """On a GPU, replay each pass from a CUDA graph captured per bucket of rows instead of
        launching its kernels one by one (:mod:`sfbus_components.models.graphed_step`); no effect
        on a CPU."""

        def __post_init__(self) -> None:
            check_device(self.device)

    actions_ready = Signal(ActionsReady, "actions were written for a request's rows")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.served: dict[int, _Served] = {}
        self.batches = 0
        """Forward passes (or random draws) served so far; one per loop iteration with work."""
        self._pending: list[InferenceRequest] = []
        self._first_arrival = 0.0
        self.blocks: BlockServer | None = None

    async def on_start(self) -> None:
        """Build the policy, attach every rollout worker's buffer and the published weights."""
        p = self.params
        torch.set_num_threads(p.torch_threads)
        metrics = self.metrics
        self.m_rows = metrics.histogram("batch_rows", "rows per forward pass", _ROW_BUCKETS)
        self.m_latency = metrics.histogram(
            "serve_latency_seconds", "first request of a batch arriving to its actions signalled",
            _LATENCY_BUCKETS)
        self.m_refreshes = metrics.counter("weight_refreshes", "weights copied from the learner")
        self.m_version = metrics.gauge("policy_version", "version of the weights in use")
        data_path = self.context.records[DataPath]
        self.data = data = data_path.params
        self.spec = data_path.spec
        self.state_size = data.state_size
        buffers = [TrajectoryBuffer(self.context, name, data_path.layout)
                   for name in data_path.workers]
        words = [data.seed, p.policy, self.context.replica]
        self.rng = np.random.default_rng([*words, 0x1F])
        self.device = torch.device("cpu") if p.random_actions else resolve_device(
            p.device, p.policy if data.num_policies == 1 else self.context.replica)
        # The model samples from a generator of this worker's own: torch's global one starts
        # from the same seed in every process, so replicas (one per rollout process with
        # appo_local_inference.yaml) would draw the same numbers and act alike.
        self.sampling = torch.Generator(self.device).manual_seed(
            int(np.random.SeedSequence([*words, 0x2F]).generate_state(1)[0]))
        self.blocks = (BlockServer(buffers, self.state_size, self.spec.action_shape, self.rng,
                                   self.sampling)
                       if data.sampling == "batched" else None)
        """Batched sampling: serves requests from slices of the buffers."""
        # The request-table gather knows only the [slot, t] layout; batched never gathers.
        self.buffers = buffers if self.blocks is None else []
        self.layout = data_path.layout
        # With agent_policies the worker's own view has no observations: each policy reads its own.
        self.rows = [_Rows(b) for b in self.buffers] if not self.layout.policy_specs else []
        self.gather = (_Gather(self.rows[0], self.state_size, self.device.type == "cuda")
                       if self.rows else None)
        # A league's opponent slots follow the trained ids: served alike, with the weights the
        # league loads into them (sfbus_components.league), never trained.
        ids = [p.policy] if data.acting_policies == 1 else range(data.acting_policies)
        self.served = {i: self._load(i) for i in ids}
        self.policy = self.served[ids[0]].model
        """The (first) served policy's network; None when acting randomly."""
        if self.policy is not None:
            self.log.info("policies %s on %s%s", list(ids), describe_device(self.device),
                          ", steps replayed from CUDA graphs" if self.policy.graphed else "")
        self.m_version.set(self.version)

    @property
    def version(self) -> int:
        """Version of the weights in use for the (first) served policy."""
        return next(iter(self.served.values())).version if self.served else 0

    def _load(self, policy: int) -> _Served:
        """Build the network of ``policy`` and copy its published weights if there are any."""
        served = self._view(policy)
        if self.params.random_actions:
            return served
        served.model = build_policy(self.data, policy).prepare_for_inference(
            self.params.packed_weights, self.device, self.params.cuda_graphs)
        if weights_name(policy) not in self.context.array_specs:
            # No learner publishes this policy (a sampler benchmark): keep the initial weights.
            self.log.info("no published weights for policy %d; serving initial weights", policy)
            return served
        served.weights = PolicyWeights(self.context, policy)
        size = flat_size(served.model.published_tensors())
        if served.weights.weights.numel() != size:
            raise ValueError(
                f"{weights_name(policy)} holds {served.weights.weights.numel()} floats but this "
                f"model has {size}: the learner and the inference worker "
                f"disagree on env or model settings")
        if served.weights.version > 0:
            self._refresh(served)
        return served

    def _view(self, policy: int) -> _Served:
        """``policy`` served from the worker's rows, or with ``agent_policies`` from its own."""
        if not self.layout.policy_specs:
            return _Served(policy, self.spec, self.rows, self.gather)
        rows = [_Rows(b.of_policy(policy)) for b in self.buffers]
        return _Served(policy, self.layout.policy_specs[policy], rows,
                       _Gather(rows[0], self.state_size, self.device.type == "cuda"))

    @slot
    def on_inference_requested(self, request: InferenceRequest) -> None:
        """Queue a request; a loop iteration's requests share one forward pass per policy."""
        if request.policy not in self.served:
            raise ValueError(f"request for policy {request.policy} reached an inference worker "
                             f"serving policies {sorted(self.served)}")
        if not self._pending:
            self._first_arrival = time.perf_counter()
            # The bus delivers a whole frame's messages synchronously, so by the time this runs
            # every request that arrived together is pending.
            asyncio.get_running_loop().call_soon(self._serve_guarded)
        self._pending.append(request)

    @slot
    def on_weights_updated(self, update: WeightsUpdated) -> None:
        """Copy new weights of a policy we serve now rather than at its next batch."""
        served = self.served.get(update.policy)
        if served is not None and served.used and served.weights is not None \
                and served.weights.version > served.version:
            self._refresh(served)

    def _refresh(self, served: _Served) -> None:
        assert served.weights is not None and served.model is not None
        # A seqlock read: ~11 MB for the paper's model, well under a millisecond.
        served.version = served.model.read_weights(served.weights)
        self.m_refreshes.inc()
        self.m_version.set(served.version)

    def _serve_guarded(self) -> None:
        # call_soon callbacks are not slots: contain failures the way the kernel does for slots.
        try:
            self._serve()
        except Exception as error:
            self.report_failure("serve", error)

    def _serve(self) -> None:
        requests, self._pending = self._pending, []
        if len(requests) > 1:
            # A request re-sent after a timeout may arrive together with its original (queued for
            # a restarted worker): serve only the newest, as both name the same rows.
            requests = list({(r.worker, r.split, r.offset): r for r in requests}.values())
        if len(self.served) == 1:
            self._serve_policy(next(iter(self.served.values())), requests)
        else:
            by_policy: dict[int, list[InferenceRequest]] = {}
            for r in requests:
                by_policy.setdefault(r.policy, []).append(r)
            for policy, group in by_policy.items():
                self._serve_policy(self.served[policy], group)
        self.batches += 1
        for r in requests:
            self.actions_ready.emit(ActionsReady(r.worker, r.split, seq=r.seq), key=r.worker)
        self.m_latency.observe(time.perf_counter() - self._first_arrival)

    def _serve_policy(self, served: _Served, requests: list[InferenceRequest]) -> None:
        """One forward pass (or random draw) of ``served`` for ``requests``."""
        served.used = True
        if served.weights is not None and served.weights.version > served.version:
            self._refresh(served)
        if self.blocks is not None:  # batched: one pass per block, on a view of it
            for r in requests:
                if served.model is None:
                    self.blocks.random(r, served.version, self.spec)
                else:
                    self.blocks.forward(served.model, r, served.version, self.params.deterministic)
                self.m_rows.observe(r.count)
            return
        indices = [served.rows[r.worker].flat_index(r.split, r.count, r.offset)
                   for r in requests]
        total = sum(r.count for r in requests)
        if served.model is None:
            self._random(served, requests, indices, total)
        else:
            self._forward(served, requests, indices, total)
        self.m_rows.observe(total)

    def _forward(self, served: _Served, requests: list[InferenceRequest],
                 indices: list[np.ndarray], total: int) -> None:
        assert served.model is not None
        assert served.gather is not None
        obs, rnn = served.gather.views(total)
        start = 0
        for r, flat in zip(requests, indices, strict=True):
            rows, end, index = served.rows[r.worker], start + r.count, torch.from_numpy(flat)
            for key, field in rows.obs.items():
                torch.index_select(field, 0, index, out=obs[key][start:end])
            if self.state_size:
                torch.index_select(rows.rnn, 0, index, out=rnn[start:end])
            start = end
        with torch.inference_mode():
            out = served.model.step(obs, rnn, self.params.deterministic, self.sampling)
        self._write_back(served, requests, indices, {
            "actions": out.actions.reshape(total, *served.spec.action_shape).numpy(),
            "log_probs": out.log_prob.numpy(), "values": out.value.numpy(),
            "action_params": out.action_logits.float().numpy(), "versions": served.version,
            "rnn": out.rnn_state.numpy()})

    def _random(self, served: _Served, requests: list[InferenceRequest],
                indices: list[np.ndarray], total: int) -> None:
        actions, log_probs = served.spec.random_actions(self.rng, total)
        # uniform logits / the standard normal random_actions draws from; no value, no state
        self._write_back(served, requests, indices, {
            "actions": actions, "log_probs": log_probs, "values": 0.0, "action_params": 0.0,
            "versions": served.version, "rnn": 0.0})

    def _write_back(self, served: _Served, requests: list[InferenceRequest],
                    indices: list[np.ndarray], fields: dict[str, np.ndarray | float]) -> None:
        """Each request's share of a pass into its rows: per buffer field, an array of the pass's
        rows or one value for all of them; ``rnn`` (last) goes into the rows one step later."""
        if not self.state_size:
            fields.pop("rnn")
        start = 0
        for r, index in zip(requests, indices, strict=True):
            rows, end = served.rows[r.worker].np, start + r.count
            for name, field in fields.items():
                if name == "rnn":
                    # The state after acting at t enters step t + 1; the index buffer is ours
                    # and no longer needed, so shift it in place.
                    index = np.add(index, 1, out=index)
                rows[name][index] = field[start:end] if isinstance(field, np.ndarray) else field
            start = end
