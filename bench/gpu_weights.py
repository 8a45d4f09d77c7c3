"""Weights from a GPU learner to a GPU inference worker: through host shared memory, or CUDA IPC.

``python -m bench.gpu_weights [--versions 50] [--env doom_basic]`` publishes ``--versions`` new
versions of the default policy from a learner process to an inference process on the same GPU,
both ways the issue asks to compare, and prints the median time per version on each side:

- *shared memory* (what sfbus does): the learner flattens its weights on the device and copies the
  vector down into a host shared-memory array (``PolicyWeights.publish``); the inference worker
  uploads it in one transfer and casts it into its parameters (``Policy.read_weights``); both
  with the array registered as page-locked memory (``PolicyWeights.page_lock``), or, for
  comparison, not (pageable);
- *CUDA IPC*: the learner flattens its weights into a device buffer that the inference process
  opened through a CUDA IPC handle (``torch.multiprocessing`` sends it); the inference worker
  copies from that buffer straight into its parameters, device to device.

Each side's time ends with a device synchronization, so it is the whole copy. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
import torch.multiprocessing as mp

from sfbus_components.datapath.buffers import PolicyWeights
from sfbus_components.datapath.settings import DataPathParams, build_policy
from sfbus_components.models.policy import Policy


class _Weights(PolicyWeights):
    """``PolicyWeights`` over a plain shared tensor (the bench has no actor context)."""

    def __init__(self, weights: torch.Tensor, counter: Any, lock: bool) -> None:
        self.weights = weights
        self.counter = counter
        self.page_locked = False
        self.lock = lock

    def page_lock(self) -> bool:
        """As ``PolicyWeights.page_lock``, or nothing for the pageable case."""
        return self.lock and super().page_lock()


def _policy(env: str, inference: bool) -> Policy:
    policy = build_policy(DataPathParams(env=env))
    if inference:
        return policy.prepare_for_inference(device=torch.device("cuda"))
    return policy.to("cuda").requires_grad_(False)  # the learner publishes between steps


def _timed(fn: Any) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _reader(mode: str, env: str, versions: int, shared: Any, flat: torch.Tensor,
            counter: Any, results: Any) -> None:
    """The inference side: wait for each version, copy it in, time it."""
    policy = _policy(env, inference=True)
    tensors = policy.published_tensors()
    weights = _Weights(shared, counter, lock=mode == "shm")
    times = []
    for version in range(1, versions + 1):
        while counter[0] < 2 * version:
            time.sleep(1e-4)
        if mode != "ipc":
            times.append(_timed(lambda: policy.read_weights(weights)))
        else:
            def copy() -> None:
                offset = 0
                with torch.no_grad():
                    for t in tensors:
                        t.copy_(flat[offset:offset + t.numel()].view_as(t))
                        offset += t.numel()
            times.append(_timed(copy))
        counter[1] = version  # read: the learner may write the next one
    results.put(times)


def measure(mode: str, env: str, versions: int) -> tuple[float, float]:
    """Median seconds per version on the learner's and the inference worker's side."""
    ctx = mp.get_context("spawn")
    learner = _policy(env, inference=False)
    tensors = learner.published_tensors()
    size = sum(t.numel() for t in tensors)
    shared = torch.zeros(size).share_memory_()
    flat = torch.zeros(size, device="cuda")
    counter = torch.zeros(2, dtype=torch.int64).share_memory_()
    results = ctx.Queue()
    reader = ctx.Process(target=_reader, args=(mode, env, versions, shared, flat, counter,
                                               results))
    reader.start()
    weights = _Weights(shared, counter, lock=mode == "shm")
    times = []
    for version in range(1, versions + 1):
        with torch.no_grad():
            for t in learner.parameters():
                t.add_(1e-3)
        if mode != "ipc":
            times.append(_timed(lambda: weights.publish(tensors, version)))  # noqa: B023
        else:
            times.append(_timed(lambda: torch.cat(
                [t.reshape(-1).float() for t in tensors], out=flat)))
            counter[0] = 2 * version
        while counter[1] < version:
            time.sleep(1e-4)
    read = results.get(timeout=120)
    reader.join()
    return statistics.median(times), statistics.median(read)


def main(argv: list[str] | None = None) -> int:
    """Measure both paths and print them side by side."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_weights", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=50, help="versions published per path")
    parser.add_argument("--env", default="doom_basic", help="env whose default policy to use")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    size = sum(t.numel() for t in _policy(args.env, False).published_tensors())
    print(f"{torch.cuda.get_device_name()}: {size:,} floats ({size * 4 / 2**20:.1f} MiB) per "
          f"version, median of {args.versions} versions")
    for mode, title in (("pageable", "shared memory, pageable"),
                        ("shm", "shared memory, page-locked"), ("ipc", "CUDA IPC")):
        publish, read = measure(mode, args.env, args.versions)
        print(f"{title:>26}: learner {publish * 1e3:.3f} ms, inference {read * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
