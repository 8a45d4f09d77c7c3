"""The GPU inference step replayed from CUDA graphs: one launch instead of one per operation.

On a GPU an inference pass of the default model costs the host about the same ~1 ms from 8 to
256 rows (docs/benchmarks/gpu.md, "GPU: learning speed"): Python and the launch of each of the
pass's kernels, not the GPU's arithmetic, and one inference process serving every rollout worker is
then the limit of a training run. :class:`GraphedStep` captures the policy's step once per bucket of
rows (powers of two) on static device buffers; a call copies its rows in, replays the bucket's
graph and returns views of its outputs. Rows past a call's own keep what an earlier call left
there and are never read (rows of a batch never mix in an inference step). A replay re-reads
only what the graph captured, so what changes between calls must change in place: the weights
(``Policy.read_weights`` copies into the parameters), the normalizer's factors
(``refresh_affine``) and the draws (the worker's generator, registered with every graph).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sfbus_components.models.actor_critic import StepOutput

StepFunction = Callable[[dict[str, Tensor], Tensor, bool, torch.Generator | None], StepOutput]
"""``(obs, rnn_state, deterministic, generator) -> StepOutput``, all on the device."""

MIN_ROWS = 8
"""The smallest bucket: fewer rows replay the 8-row graph."""
MAX_ROWS = 4096
"""The largest bucket: the caller runs passes of more rows eagerly (the GPU's arithmetic
outweighs the launches there)."""
WARMUP_PASSES = 2
"""Eager passes before a capture, as torch's CUDA graph notes advise (algorithm choices and
lazily made state settle outside the graph)."""


@dataclass
class _Capture:
    """One bucket's graph and the static tensors it reads and writes."""

    graph: torch.cuda.CUDAGraph
    obs: dict[str, Tensor]
    rnn_state: Tensor
    out: StepOutput


def bucket_rows(rows: int) -> int:
    """The rows of the graph a pass of ``rows`` rows replays: the next power of two, at least
    :data:`MIN_ROWS`."""
    return max(MIN_ROWS, 1 << (rows - 1).bit_length())


class GraphedStep:
    """``step`` on a CUDA device, captured on first use of each (bucket, deterministic,
    generator) and replayed after."""

    def __init__(self, step: StepFunction, device: torch.device) -> None:
        self.step = step
        self.device = device
        # Each graph keeps a memory pool of its own (torch's default; the largest bucket's
        # activations take a few hundred MB): torch calls a shared pool safe for graphs that
        # replay in the order they were captured, and a worker's buckets come in any order.
        self.captures: dict[tuple[int, bool, torch.Generator | None], _Capture] = {}

    def __call__(self, obs: dict[str, Tensor], rnn_state: Tensor, deterministic: bool,
                 generator: torch.Generator | None) -> StepOutput:
        """The step for at most :data:`MAX_ROWS` host (pinned) rows; the outputs are on the
        device and valid until the next call."""
        rows = len(rnn_state)
        key = (bucket_rows(rows), deterministic, generator)
        capture = self.captures.get(key)
        if capture is None:
            capture = self.captures[key] = self._capture(key[0], obs, rnn_state, deterministic,
                                                         generator)
        with torch.cuda.device(self.device):  # the copies and the replay on one stream
            for name, value in obs.items():
                capture.obs[name][:rows].copy_(value, non_blocking=True)
            capture.rnn_state[:rows].copy_(rnn_state, non_blocking=True)
            capture.graph.replay()
        return StepOutput(**{field.name: getattr(capture.out, field.name)[:rows]
                             for field in dataclasses.fields(StepOutput)})

    def _capture(self, rows: int, obs: dict[str, Tensor], rnn_state: Tensor,
                 deterministic: bool, generator: torch.Generator | None) -> _Capture:
        """Static inputs of ``rows`` rows shaped as ``obs`` and ``rnn_state``, warm-up passes on
        a side stream (cuDNN and cuBLAS pick their algorithms and workspaces outside the
        capture, as torch's CUDA graph notes ask), then the captured pass on that stream; on
        this worker's GPU, which need not be the process's current one."""
        with torch.cuda.device(self.device):
            static_obs = {name: torch.zeros((rows, *value.shape[1:]), dtype=value.dtype,
                                            device=self.device) for name, value in obs.items()}
            static_state = torch.zeros((rows, *rnn_state.shape[1:]), dtype=rnn_state.dtype,
                                       device=self.device)
            # Warm-up and capture on one side stream: cuBLAS and cuDNN keep workspaces per
            # stream, and one first made inside the capture would be an illegal allocation.
            current = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(WARMUP_PASSES):
                    self.step(static_obs, static_state, deterministic, generator)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            if generator is not None:  # torch's default generator is registered by itself
                graph.register_generator_state(generator)
            # thread_local: CUDA calls of other threads (a pinned-memory allocation, say) do
            # not break this capture
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                out = self.step(static_obs, static_state, deterministic, generator)
        return _Capture(graph, static_obs, static_state, out)
