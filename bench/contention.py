"""doom_benchmark training's ceiling on this machine, its irreducible parts run together.

``python -m bench.contention [--seconds 60] [--warmup 20] [--workers N] [--envs 16]`` runs at
once, without sfbus, the work a training batch cannot do without:

- ``--workers`` simulation processes (default: every core), each pinned to its core with its
  VizDoom engines, stepping ``--envs`` ``doom_benchmark`` envs into preallocated rows and taking
  their actions from one packed inference pass of the default model per step
  (``bench.throughput``'s pure simulation with the model acting: a rollout process with its
  inference worker, less trajectories, messages and statistics);
- one learner process, unpinned, stepping APPO on a fixed batch of 32 x 32 frames of 3x72x128
  (``bench.arithmetic.LearnerStep``) over two sequence threads, as the training layout runs it.

It prints what each part costs in CPU per 1,024-sample batch (4,096 env frames) and the ceiling:
every core busy at that cost. ``bench.arithmetic``'s ceiling adds the parts timed alone on an
idle machine; here they share the caches and memory as in training, so what training spends
beyond this is sfbus's own.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from typing import Any

from bench import throughput as tp
from bench import throughput_topologies as tt
from bench.paper_table import fast_bf16

ENV = "doom_benchmark"
BATCH = 1024
"""Samples a learner step trains on (``LearnerStep``'s 32 trajectories x 32 steps)."""


def _learn(steps: Any, ready: Any, stop: Any, precision: str, threads: int) -> None:
    """The learner process: APPO steps on a fixed batch until ``stop``, counted."""
    import torch

    from bench.arithmetic import LearnerStep
    from sfbus.heap import keep_freed_memory

    keep_freed_memory()  # as a run's learner
    torch.set_num_threads(1)
    step = LearnerStep(precision)
    step.model.sequence_threads = threads
    step.run()  # warm-up: allocator, oneDNN kernels
    ready.put((-1, 0))
    while not stop.is_set():
        step.run()
        steps.value += 1


def measure(args: argparse.Namespace) -> tuple[tt.Window, int, float]:
    """The parts run together over the window: the window (simulation frames, CPU by process),
    the learner's steps in it, and the precision's name."""
    precision = "bfloat16" if fast_bf16() else "float32"
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    counters = [ctx.RawValue("q", 0) for _ in range(args.workers)]
    learned = ctx.RawValue("q", 0)
    procs = [ctx.Process(target=tp._simulate, args=(ENV, args.envs, i, core, 32, counters[i],
                                                    ready, stop, {}, 0, precision))
             for i, core in enumerate(tt.affinity(args.workers))]
    procs.append(ctx.Process(target=_learn, args=(learned, ready, stop, precision,
                                                  args.threads)))
    for p in procs:
        p.start()
    try:
        frameskip = max(f for _, f in tp._wait_ready(ready, procs))
        roots = {p.pid: f"simulation.{i}" for i, p in enumerate(procs[:-1])
                 if p.pid is not None}
        if procs[-1].pid is not None:
            roots[procs[-1].pid] = "learner"

        def frames_now() -> tuple[float, int]:
            return time.monotonic(), sum(c.value for c in counters) * frameskip

        def wait(until: float) -> tuple[float, int]:
            time.sleep(max(0.0, until - time.monotonic()))
            return frames_now()

        window = tt.measure(roots, frames_now, wait, args.warmup, args.seconds,
                            probe=lambda: {"learner steps": (float(learned.value), 0.0)})
        return window, frameskip, precision
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def report(window: tt.Window, frameskip: int) -> list[str]:
    """Each part's cores and CPU per batch, and the ceiling they give."""
    steps = window.extra["histograms"]["learner steps"][0]
    env_steps = window.frames / frameskip
    learner = window.cpu.get("learner", (0.0, 0))[0] * window.seconds
    simulation = sum(share for name, (share, _) in window.cpu.items()
                     if name != "learner") * window.seconds
    if not steps or not env_steps:
        raise RuntimeError("a part made no progress in the window: lengthen --seconds")
    per_batch = {"simulation with the model acting (engines included)":
                 simulation / env_steps * BATCH,
                 "learner step": learner / steps}
    rows = ["| part | cores | rate | CPU per batch |", "| --- | ---: | ---: | ---: |"]
    rates = {"learner step": f"{steps / window.seconds:.2f} steps/s"}
    for name, seconds in per_batch.items():
        cores = seconds * (steps if name == "learner step" else env_steps / BATCH)
        rate = rates.get(name, f"{window.rate:,.0f} env frames/s")
        rows.append(f"| {name} | {cores / window.seconds:.2f} | {rate} | {seconds:.3f} core-s |")
    total = sum(per_batch.values())
    cores = len(os.sched_getaffinity(0))
    rows.append(f"| **together** | {window.cores:.2f} | | **{total:.3f} core-s**: ceiling "
                f"**{cores / total * BATCH * frameskip:,.0f} env frames/s** on {cores} cores |")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the parts together and print the ceiling."""
    parser = argparse.ArgumentParser(prog="python -m bench.contention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before the window")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="simulation processes, one core each (default: every core)")
    parser.add_argument("--envs", type=int, default=16, help="envs per simulation process")
    parser.add_argument("--threads", type=int, default=2,
                        help="the learner's sequence threads (the training layout's 2)")
    args = parser.parse_args(argv)
    if min(args.workers, args.envs, args.threads) < 1 or args.seconds <= 0:
        parser.error("--workers, --envs and --threads must be at least 1, --seconds above 0")
    window, frameskip, precision = measure(args)
    print(f"Machine: {tp.machine()}\n\nCommand: `python -m bench.contention "
          f"{' '.join(sys.argv[1:] if argv is None else argv)}`".rstrip() +
          f"\n\n{args.workers} simulation processes of {args.envs} {ENV} envs and the "
          f"learner, {precision}, over {window.seconds:.0f} s after {args.warmup:g} s; "
          f"machine busy {window.machine_busy:.2f} cores\n")
    print("\n".join(report(window, frameskip)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
