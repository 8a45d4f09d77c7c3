"""A training topology's ceiling on this machine: the work it cannot do without, run together.

``python -m bench.contention [--duel] [--seconds 60] [--warmup 20] [--workers N] [--envs 16]
[--set KEY=VALUE ...]`` runs at once, without sfbus's processes, messages and buffers, what the
training topology's batches cannot do without:

- one simulation process per rollout process of the topology, pinned to its core with its
  VizDoom engines (and a duel's player processes) and under its scheduling policy, stepping the
  topology's envs into preallocated rows, their actions from the topology's model: per step one
  packed inference pass per policy acting, every agent acting for a policy drawn at its
  episode's start (``bench.throughput``'s pure simulation with the model acting: a rollout
  process with its inference worker, less trajectories, messages and statistics);
- one learner process, unpinned and under the learner process's scheduling policy, running
  every learner of the topology (``Learner.update``, the learner's own step and threads) in
  turn, each on a fixed random batch of the topology's size.

The topology: by default doom_benchmark as Table 1 trains it (``topologies/doom_basic.yaml``,
``--workers`` rollout processes of ``--envs`` envs, float32 or bfloat16 as ``precision: auto``
takes on this CPU); with ``--duel``, ``topologies/selfplay_duel.yaml`` as it stands (2 rollout
processes of one match each, the 4 policies acting and their 4 learners). ``--set`` overrides
the topology as ``sfbus run``'s does.

It prints what each part costs in CPU per 1,024 samples (4,096 env frames at frameskip 4) and
the ceiling: every core busy at that cost. ``bench.arithmetic``'s ceiling adds the parts timed
alone on an idle machine; here they share the caches and memory as in training, so what training
spends beyond this is sfbus's own.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time
from typing import Any

from bench import throughput as tp
from bench import throughput_topologies as tt

ENV = "doom_benchmark"
DUEL = "topologies/selfplay_duel.yaml"
SAMPLES = 1024
"""The samples the report prices each part at (doom_benchmark's training batch)."""


def topology_args(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The training topology measured and its overrides (``KEY=VALUE`` each)."""
    sets = [s for pair in args.set for s in pair]
    if args.duel:
        return str(tt.ROOT / DUEL), sets
    sizes = tt.training_overrides(ENV, args.workers, args.envs)[1::2]
    return str(tt.ROOT / tt.TRAINING), sizes + sets


def process_with(path: str, sets: list[str], actor_class: str) -> Any:
    """The topology's first process hosting an actor whose class is named ``actor_class``."""
    from sfbus.topology import load_topology

    return next(p for p in load_topology(path, sets).processes
                if any(a.class_path.endswith(f":{actor_class}") for a in p.actors))


def rollout_data(path: str, sets: list[str]) -> tuple[Any, Any]:
    """The topology's data path (its rollout actor's) and its rollout process."""
    from sfbus_components.datapath.settings import data_path_params

    process = process_with(path, sets, "RolloutWorker")
    actor = next(a for a in process.actors if a.class_path.endswith(":RolloutWorker"))
    return data_path_params(actor.params), process


def _learn(path: str, sets: list[str], samples: Any, ready: Any, stop: Any) -> None:
    """The learner process: every learner of the topology steps on its own fixed batch, in
    turn, until ``stop``; the samples trained counted."""
    from sfbus.child import apply_scheduling
    from sfbus.heap import keep_freed_memory

    keep_freed_memory()  # as a run's learner process
    apply_scheduling(process_with(path, sets, "Learner").scheduling)
    learners = build_learners(path, sets)
    for learner, batch in learners:  # warm-up: allocator, oneDNN kernels
        learner.update(batch, learner.params, None)
    ready.put((-1, 0))
    while not stop.is_set():
        for learner, batch in learners:
            batch["versions"].fill_(learner.training.version)  # never lagging: all trained
            learner.update(batch, learner.params, None)
            samples.value += batch["log_probs"].numel()


def build_learners(path: str, sets: list[str]) -> list[tuple[Any, dict[str, Any]]]:
    """Every learner of the topology, built as its run builds it, with a batch of its size."""
    from sfbus.topology import load_topology
    from sfbus_components.learning.learner import Learner

    data, _ = rollout_data(path, sets)
    learners = []
    for process in load_topology(path, sets).processes:
        for actor in process.actors:
            if actor.class_path.endswith(":Learner"):
                learner = Learner(actor.name, actor.params)
                learner.build(data=data)
                learners.append((learner, random_batch(learner, data.trajectories_per_batch,
                                                       data.rollout)))
    return learners


def random_batch(learner: Any, trajectories: int, steps: int) -> dict[str, Any]:
    """A batch in ``BatchCopy``'s layout for ``learner``'s spaces: random frames and
    measurements, actions within each head, acted by a uniform policy."""
    import torch

    spec, n, t = learner.spec, trajectories, steps
    gen = torch.Generator().manual_seed(learner.params.policy)
    obs = {key: torch.randint(0, 256, (n, t + 1, *f.shape), dtype=torch.uint8, generator=gen)
           if f.dtype == "uint8" else torch.randn(n, t + 1, *f.shape, generator=gen)
           for key, f in spec.observation_space.items()}
    actions = torch.stack([torch.randint(0, size, (n, t), generator=gen)
                           for size in spec.action_heads], dim=-1)
    uniform = -sum(math.log(size) for size in spec.action_heads)
    states = (n, t + 1) if learner.params.every_state(t) else (n,)
    return {"obs": obs, "rnn": torch.zeros(*states, learner.data.state_size), "actions": actions,
            "log_probs": torch.full((n, t), uniform),
            "action_params": torch.zeros(n, t, spec.action_params_size),
            "values": torch.randn(n, t, generator=gen), "rewards": torch.randn(n, t, generator=gen),
            "dones": torch.zeros(n, t, dtype=torch.uint8),
            "time_outs": torch.zeros(n, t, dtype=torch.uint8),
            "versions": torch.zeros(n, t, dtype=torch.int64),
            "policies": torch.full((n, t), learner.params.policy, dtype=torch.int64)}


def measure(args: argparse.Namespace) -> tuple[tt.Window, int, Any]:
    """The parts run together over the window: the window (simulation frames, CPU by process),
    the samples trained in it, and the topology's data path."""
    path, sets = topology_args(args)
    data, process = rollout_data(path, sets)
    workers = process.replicas
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    counters = [ctx.RawValue("q", 0) for _ in range(workers)]
    learned = ctx.RawValue("q", 0)
    procs = [ctx.Process(target=tp._simulate, args=(data.env, data.num_envs, i, core, 32,
                                                    counters[i], ready, stop, data.env_kwargs,
                                                    0, data, process.scheduling))
             for i, core in enumerate(tt.affinity(workers))]
    procs.append(ctx.Process(target=_learn, args=(path, sets, learned, ready, stop)))
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
                            probe=lambda: {"learned samples": (float(learned.value), 0.0)})
        return window, frameskip, data
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def report(window: tt.Window, frameskip: int) -> list[str]:
    """Each part's cores and CPU per 1,024 samples, and the ceiling they give."""
    learned = window.extra["histograms"]["learned samples"][0]
    env_steps = window.frames / frameskip
    learner = window.cpu.get("learner", (0.0, 0))[0] * window.seconds
    simulation = sum(share for name, (share, _) in window.cpu.items()
                     if name != "learner") * window.seconds
    if not learned or not env_steps:
        raise RuntimeError("a part made no progress in the window: lengthen --seconds")
    machine = os.cpu_count() or 1
    if window.cores > machine * 1.05:  # seen once on a shared VM, cause unknown: no ceiling
        raise RuntimeError(f"the window counted {window.cores:.1f} cores busy on a machine of "
                           f"{machine}: its CPU figures are wrong; run it again")
    parts = {"simulation with the model acting (engines included)":
             (simulation, env_steps, f"{window.rate:,.0f} env frames/s"),
             "learners": (learner, learned, f"{learned / window.seconds:,.0f} samples/s")}
    rows = [f"| part | cores | rate | CPU per {SAMPLES:,} samples |",
            "| --- | ---: | ---: | ---: |"]
    for name, (cpu, done, rate) in parts.items():
        rows.append(f"| {name} | {cpu / window.seconds:.2f} | {rate} | "
                    f"{cpu / done * SAMPLES:.3f} core-s |")
    total = sum(cpu / done * SAMPLES for cpu, done, _ in parts.values())
    cores = len(os.sched_getaffinity(0))
    rows.append(f"| **together** | {window.cores:.2f} | | **{total:.3f} core-s**: ceiling "
                f"**{cores / total * SAMPLES * frameskip:,.0f} env frames/s** on {cores} cores |")
    return rows


def main_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.contention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duel", action="store_true",
                        help=f"{DUEL} as it stands instead of doom_benchmark's Table-1 layout")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before the window")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="doom_benchmark's rollout processes, one core each (default: every "
                             "core)")
    parser.add_argument("--envs", type=int, default=16,
                        help="doom_benchmark's envs per rollout process")
    parser.add_argument("--set", action="append", nargs=1, default=[], metavar="KEY=VALUE",
                        help="override the topology, as sfbus run --set")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the parts together and print the ceiling."""
    parser = main_parser()
    args = parser.parse_args(argv)
    if min(args.workers, args.envs) < 1 or args.seconds <= 0:
        parser.error("--workers and --envs must be at least 1, --seconds above 0")
    if args.duel and {"--workers", "--envs"} & set(sys.argv[1:] if argv is None else argv):
        parser.error("--duel measures selfplay_duel.yaml's own layout: set its sizes with --set")
    window, frameskip, data = measure(args)
    workers = rollout_data(*topology_args(args))[1].replicas
    print(f"Machine: {tp.machine()}\n\nCommand: `python -m bench.contention "
          f"{' '.join(sys.argv[1:] if argv is None else argv)}`".rstrip() +
          f"\n\n{topology_args(args)[0].rpartition('/')[2]}: {workers} simulation processes of "
          f"{data.num_envs} {data.env} envs, {data.num_policies} policies acting, and their "
          f"learners, over {window.seconds:.0f} s after {args.warmup:g} s; machine busy "
          f"{window.machine_busy:.2f} cores\n")
    print("\n".join(report(window, frameskip)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
