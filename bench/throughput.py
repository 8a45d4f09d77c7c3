"""Env frames/s of pure simulation, of the sampler alone and of full training, side by side.

``python -m bench.throughput [--seconds S] [--workers 2] [--envs 16] [--env doom_basic]
[--cases ...] [--write-docs] [--quick]`` runs six cases one after another, each in fresh
processes:

1. pure simulation: ``--workers`` spawn processes, each pinned to its own core before it creates
   its envs (so the VizDoom engines inherit the pin), stepping ``--envs`` envs with random actions
   through ``step_into`` into preallocated rows (the system's own observation preprocessing);
2. the sampler with a trivial policy: rollout processes, each hosting an inference worker drawing
   random actions, and :class:`TrajectorySink` in place of the learner, under ``sfbus run``;
3. the sampler with the real model (conv + GRU, initial weights; no learner);
4. full training: ``topologies/doom_basic.yaml`` at the same workers and envs;
5. and 6. Sample Factory 2.1.1's sampler alone and its full training with the same model, sizes and
   scenario, in its own virtual environment (:mod:`bench.sample_factory`).

Each rate is taken over a window of ``--seconds`` that starts ``--warmup`` seconds after the first
frames; the CPU time of every process (VizDoom engines included) and the memory are sampled from
``/proc`` at the window's ends. See ``bench/throughput_topologies.py`` for the sfbus side.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import queue
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import throughput_topologies as tt
from bench.report import machine as machine_line
from bench.report import write_section
from sfbus import Actor, Signal, slot
from sfbus.child import apply_scheduling
from sfbus_components.datapath.messages import SlotsReleased, TrajectoryReady
from sfbus_components.datapath.settings import DataPathParams, policy_spec

ROOT = Path(__file__).resolve().parent.parent
DOC, SECTION = "throughput_cpu.md", "## Throughput: simulation, sampler, training"
DOC_GPU, SECTION_GPU = "gpu.md", "## Throughput on a GPU: simulation and training"
CASES = {"sim": "pure simulation", "sim_short": "pure simulation, short episodes",
         "random": "sampler, random actions",
         "model": "sampler, real model", "train": "full training",
         "sf_model": "Sample Factory: sampler alone, real model",
         "sf_train": "Sample Factory: full training"}
# Which Sample Factory case each sfbus case is compared with, and the goal ratio.
VERSUS = {"model": ("sf_model", 2.0), "train": ("sf_train", 2.5)}
# On a GPU: full training against Sample Factory, and its share of pure simulation.
GPU_GOALS = {"train": 1.5, "share": 0.6}
ABOUT = """Cases run one after another, each in fresh processes, with %(workers)d rollout
workers (or simulation processes) of %(envs)d envs each, every one pinned to its own core with
the VizDoom engines it starts (simulation processes under SCHED_BATCH, as the CPU training
topology runs its processes). A rate is env frames (agent steps x frameskip) per second over a
%(seconds)g s window that starts %(warmup)g s after the first frames, so start-up is left out.
*Pure simulation* steps the envs with random actions through `step_into` into preallocated rows
(the same 128x72 resize and CHW copy as the system), nothing else; *with short episodes* it also
starts a new episode in every env each %(short)d steps, as a trained agent's episodes end
(random actions in doom_basic last about 30 steps, a chance hit or the 300-tic timeout; a
trained agent's about 6), so each step carries its share of the engine's map restart. The
*sampler* cases run `sfbus run` on a generated topology with the training topology's layout:
the rollout processes, each hosting an inference worker (random actions drawn by the worker,
or the default model, conv + GRU 512, serving its initial weights), and a sink actor
(`bench.throughput:TrajectorySink`) that hands each finished slot straight back, with the stats
actor; its data-path settings (T, batch size, splits) are those of `%(training)s`. *Full
training* is `sfbus run %(training)s %(sets)s`. The *Sample Factory* cases run
Sample Factory 2.1.1 from its own virtual environment (`bench/sample_factory.py`: `--device=cpu`,
its `convnet_simple` encoder, GRU 512, rollout 32, batch 1024, 2 splits, workers pinned; the
sampler is its `SamplingLoop` with each trajectory handed straight back), its rate read from the
learner's (or the loop's) frame counts over the same window. Rates of the sfbus cases come from
`progress.jsonl` (reports every 0.5 s, rollout progress every 0.1 s). CPU is the `/proc`
utime+stime of every process over the window, in cores (1.00 = one core busy; in pure simulation
`rollout.i` is simulation process i); memory sums RSS
(shared memory counted in each process that maps it) and PSS (counted once). *Others' cores* is
what the rest of the machine used meanwhile (`/proc/stat` busy time less this case's processes):
a figure far from 0 means the case shared its cores and its rate is low. For each sfbus case the
last lines give its inference passes over the window, from the inference workers' Prometheus
histograms: passes per second, rows per pass, and the time from a pass's first request arriving
to its actions signalled; then the rollout workers' mean round trip of a request, the share
of the window they stepped no split (their `idle_seconds` counter) and the time their splits
waited for free slots (`paused_seconds`: the learner's back-pressure), and the learner's pace while
it trains (from the batches `progress.jsonl` reports) with the share of the window it trained."""
ABOUT_GPU = """As above (fresh processes per case, %(workers)d rollout workers or simulation
processes of %(envs)d envs, each pinned to its own core; rates over a %(seconds)g s window that
starts %(warmup)g s after the first frames), on a machine with a GPU: *full training* is `sfbus
run %(training)s %(sets)s --set device=cuda` (the paper's layout: one inference process on the
GPU batching every rollout worker's requests, the learner on the GPU), *Sample Factory: full
training* the same flags as on the CPU but `--device=gpu`."""


class TrajectorySink(Actor):
    """Stands in for the batcher and learner: hands every finished slot straight back."""

    component = "sink"
    slots_released = Signal(SlotsReleased, "a finished slot may be refilled")

    @slot
    def on_trajectory_ready(self, msg: TrajectoryReady) -> None:
        """Release the slot at once, to its own worker."""
        self.slots_released.emit(SlotsReleased(msg.worker, (msg.slot,)), key=msg.worker)


# ----- pure simulation ----------------------------------------------------------------------

def _simulate(env: str, envs: int, worker: int, core: int, rollout: int, steps: Any,
              ready: Any, stop: Any, env_kwargs: dict[str, Any], episode_steps: int,
              acting: DataPathParams | None = None, scheduling: str = "batch") -> None:
    """One simulation process: pin, make envs, step them with random actions until ``stop``,
    starting a new episode in each every ``episode_steps`` steps (0: only where one ends); with
    ``acting`` (a data path), the actions come from its policies' packed inference passes over
    the envs' last observations, one per policy acting, as an inference worker serves its
    rollout process; the process and its engines under Linux's ``scheduling`` policy, as
    sfbus's CPU topologies run their rollout processes (SCHED_BATCH: fewer context switches
    between a process and its engines, the simulation's best)."""
    os.sched_setaffinity(0, [core])  # before the envs, so that their engine processes inherit it
    apply_scheduling(scheduling)  # likewise
    with contextlib.suppress(ImportError):
        import cv2

        cv2.setNumThreads(1)
    from sfbus_components.envs import EnvError, make_env

    made = [make_env(env, **env_kwargs) for _ in range(envs)]
    spec = made[0].spec
    na = spec.num_agents
    # Rows as in a trajectory buffer, [agents, T+1, ...]: each step writes the next column.
    obs = {k: np.zeros((envs * na, rollout + 1, *f.shape), f.dtype)
           for k, f in spec.observation_space.items()}
    outs = [[{k: a[e * na:(e + 1) * na, t] for k, a in obs.items()} for e in range(envs)]
            for t in range(rollout + 1)]
    for e, m in enumerate(made):
        m.reset_into(outs[0][e], seed=1000 * worker + e)
    rng = np.random.default_rng(worker)
    act = _ModelActions(acting, envs * na, worker) if acting else None
    ready.put((worker, spec.frameskip))
    t = taken = 0
    while not stop.is_set():
        last, t = t, t % rollout + 1
        taken += 1
        cut = bool(episode_steps) and taken % episode_steps == 0
        actions = act({k: a[:, last] for k, a in obs.items()}) if act \
            else spec.random_actions(rng, envs * na)[0]
        for e in range(envs):
            try:
                _, dones, _, _ = made[e].step_into(actions[e * na:(e + 1) * na], outs[t][e])
            except EnvError:  # as the rollout worker does: replace the broken env
                made[e].close()
                made[e] = make_env(env, **env_kwargs)
                made[e].reset_into(outs[t][e])
                dones = np.ones(na, bool)
            if cut:  # as a trained agent's short episodes end (the engine restarts its map)
                made[e].reset_into(outs[t][e])
            if act and (cut or dones.any()):
                act.new_episodes(np.flatnonzero(np.asarray(dones, bool) | cut) + e * na)
        steps.value += envs * na
    for m in made:
        m.close()


class _ModelActions:
    """The actions ``data``'s policies (its model, initial weights, packed) take on ``rows``
    observations a call: each row acts for a policy drawn at its episode's start, as a random
    policy mapping does, and every policy acting takes one pass over its rows; the RNN state is
    carried between calls."""

    def __init__(self, data: DataPathParams, rows: int, seed: int = 0) -> None:
        import torch

        from sfbus_components.datapath.settings import build_policy

        torch.set_num_threads(1)
        self.policies = []
        for policy in range(data.num_policies):
            torch.manual_seed(policy)
            self.policies.append(build_policy(data, policy).prepare_for_inference(packed=True))
        self.state = torch.zeros(rows, self.policies[0].model.state_size)
        self.shape = (rows, *policy_spec(data).action_shape)
        self.rng = np.random.default_rng(seed)
        self.acting = self.rng.integers(0, len(self.policies), rows)

    def new_episodes(self, rows: np.ndarray) -> None:
        """``rows`` start an episode: each draws its policy anew (their state is the env's)."""
        self.acting[rows] = self.rng.integers(0, len(self.policies), len(rows))

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """The actions for ``obs`` (a row per env agent)."""
        import torch

        actions = np.empty(self.shape, np.int64)
        for policy in np.unique(self.acting):
            rows = np.flatnonzero(self.acting == policy)
            whole = len(rows) == len(self.acting)  # one policy: no gather, as one pass of all
            # the copy is the inference worker's gather of its rows
            batch = {k: torch.from_numpy(np.ascontiguousarray(v if whole else v[rows]))
                     for k, v in obs.items()}
            with torch.inference_mode():
                out = self.policies[policy].step(batch, self.state if whole else
                                                 self.state[rows])
            if whole:
                self.state = out.rnn_state
            else:
                self.state[rows] = out.rnn_state
            actions[rows] = out.actions.numpy().reshape(len(rows), *self.shape[1:])
        return actions


def _wait_ready(ready: Any, procs: list[Any], timeout: float = 300.0) -> list[tuple[int, int]]:
    """Every process's (index, frameskip) once its envs are made; fails as soon as one died."""
    found: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(found) < len(procs):
        try:
            found.append(ready.get(timeout=1.0))
        except queue.Empty:
            if died := [p.exitcode for p in procs if p.exitcode is not None]:
                raise RuntimeError(f"a simulation process exited with code {died[0]} before its "
                                   f"envs were ready (its error is above)") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulation processes not ready after {timeout:g} s") from None
    return found


def pure_simulation(env: str, workers: int, envs: int, warmup: float, seconds: float,
                    env_kwargs: dict[str, Any] | None = None,
                    episode_steps: int = 0) -> tt.Window:
    """``workers`` pinned processes stepping their envs with random actions, measured (with
    ``episode_steps``, each env's episodes cut to that many steps)."""
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    counters = [ctx.RawValue("q", 0) for _ in range(workers)]
    procs = [ctx.Process(target=_simulate, args=(env, envs, i, core, 32, counters[i], ready, stop,
                                                 env_kwargs or {}, episode_steps))
             for i, core in enumerate(tt.affinity(workers))]
    started = time.monotonic()
    for p in procs:
        p.start()
    try:
        frameskips = [f for _, f in sorted(_wait_ready(ready, procs))]
        startup = time.monotonic() - started

        def frames_now() -> tuple[float, int]:
            return time.monotonic(), sum(c.value * f for c, f in zip(counters, frameskips,
                                                                    strict=True))

        def wait(until: float) -> tuple[float, int]:
            time.sleep(max(0.0, until - time.monotonic()))
            return frames_now()

        roots = {p.pid: f"rollout.{i}" for i, p in enumerate(procs) if p.pid is not None}
        window = tt.measure(roots, frames_now, wait, warmup, seconds)
        window.startup_s = startup
        return window
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


# ----- the cases ----------------------------------------------------------------------------

def run_case(key: str, args: argparse.Namespace) -> tt.Window:
    """Run one case in fresh processes and return its measured window."""
    if key in ("sim", "sim_short"):
        return pure_simulation(args.env, args.workers, args.envs, args.warmup, args.seconds,
                               episode_steps=args.short_episodes if key == "sim_short" else 0)
    if key.startswith("sf_"):
        from bench import sample_factory

        run = sample_factory.run_sampler if key == "sf_model" else sample_factory.run_training
        return run(args.seconds, args.warmup, env=args.env, workers=args.workers,
                   envs=args.envs, device="gpu" if args.gpu else "cpu")
    with tempfile.TemporaryDirectory(prefix="sfbus-bench-") as tmp:
        if key == "train":
            sets = training_sets(args)
            if args.gpu:
                sets += ["--set", "device=cuda"]
            return tt.run_sfbus([training(args), *sets], args.warmup, args.seconds, Path(tmp))
        if args.gpu:
            raise SystemExit("the sampler cases run the CPU layout; with --gpu use "
                             "--cases sim,train,sf_train")
        topology = tt.sampler_topology(args.env, args.workers, args.envs, key == "random")
        return tt.run_sfbus([str(Path(tmp, "bench.yaml"))], args.warmup, args.seconds,
                            Path(tmp), topology)


def training_sets(args: argparse.Namespace) -> list[str]:
    """``--set`` arguments of the training case: this bench's sizes, then the user's own."""
    return tt.training_overrides(args.env, args.workers, args.envs, args.set)


def training(args: argparse.Namespace) -> str:
    """The training topology of this run: the GPU layout with ``--gpu``."""
    return tt.TRAINING_GPU if args.gpu else tt.TRAINING


def _k(rate: float) -> str:
    return f"{rate / 1e3:,.2f}k" if rate < 1e4 else f"{rate / 1e3:,.1f}k"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def rate_table(results: dict[str, tt.Window]) -> str:
    """Rates, ratios to pure simulation, CPU and memory per case, with Sample Factory's rows."""
    base = results["sim"].rate if "sim" in results else 0.0
    rows = ["| case | env frames/s | vs pure simulation | cores used | others' cores | "
            "memory RSS / PSS | window, start-up |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for key, w in results.items():
        ratio = f"{w.rate / base:.0%}" if base else "-"
        rows.append(f"| {CASES[key]} | {_k(w.rate)} | {ratio} | {w.cores:.2f} | {w.others:.2f} | "
                    f"{_gib(w.rss)} / {_gib(w.pss)} | {w.seconds:.1f} s, start-up "
                    f"{w.startup_s:.1f} s |")
    return "\n".join(rows)


def cpu_table(results: dict[str, tt.Window]) -> str:
    """Cores used by each process group in each case."""
    names: list[str] = []
    for w in results.values():
        names += [n for n in sorted(w.cpu, key=_order) if n not in names]
    names.sort(key=_order)
    rows = ["| process | " + " | ".join(CASES[k] for k in results) + " |",
            "| --- |" + " ---: |" * len(results)]
    for name in names:
        counts = {w.cpu[name][1] for w in results.values() if name in w.cpu}
        label = name + (f" (x{max(counts)})" if max(counts) > 1 else "")
        cells = [f"{w.cpu[name][0]:.2f}" if name in w.cpu else "" for w in results.values()]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    totals = [f"**{w.cores:.2f}**" for w in results.values()]
    rows.append("| **total** | " + " | ".join(totals) + " |")
    others = [f"{w.others:.2f}" for w in results.values()]
    rows.append("| everything else on the machine | " + " | ".join(others) + " |")
    return "\n".join(rows)


def inference_passes(results: dict[str, tt.Window]) -> str:
    """For each sfbus case, its inference passes over the window (how many, their mean rows and
    mean time from a pass's first request arriving to its actions signalled) and what its
    rollout workers waited: the mean round trip of a request, and the share of their time they
    stepped no split (waiting for actions, or for a pass in their own process); and the
    learner's pace while it trains against what it trained: near 100% busy, it sets the rate."""
    lines = []
    for key, w in results.items():
        histograms = w.extra.get("histograms", {})
        rows, passes = histograms.get(tt.INFERENCE_HISTOGRAMS[0], (0.0, 0.0))
        latency, served = histograms.get(tt.INFERENCE_HISTOGRAMS[1], (0.0, 0.0))
        round_trips, answered = histograms.get(tt.ROLLOUT_WAITS[0], (0.0, 0.0))
        idle, _ = histograms.get(tt.ROLLOUT_WAITS[1], (0.0, 0.0))
        paused, _ = histograms.get(tt.ROLLOUT_WAITS[2], (0.0, 0.0))
        workers = sum(1 for name in w.cpu if name.split(".")[0] == "rollout" and " " not in name)
        if passes and served:
            line = (f"- {CASES[key]}: {passes / w.seconds:,.0f} inference passes/s, "
                    f"{rows / passes:.1f} rows per pass, {1e3 * latency / served:.2f} ms "
                    f"from a pass's first request to its actions")
            if answered and workers:
                line += (f"; a request's round trip from its rollout worker "
                         f"{1e3 * round_trips / answered:.2f} ms, the rollout workers stepping no "
                         f"split {idle / (w.seconds * workers):.0%} of the window, their splits "
                         f"paused for free slots {paused / (w.seconds * workers):.2f} "
                         f"split-seconds a second each")
            per_frame, batches = histograms.get(tt.LEARNER_TOTALS[0], (0.0, 0.0))
            trained, _ = histograms.get(tt.LEARNER_TOTALS[1], (0.0, 0.0))
            if batches and trained:
                pace = batches / per_frame
                line += (f"; the learner trained {trained / w.seconds:,.0f} env frames/s at a pace "
                         f"of {pace:,.0f} while training (busy {trained / pace / w.seconds:.0%} "
                         f"of the window)")
            lines.append(line)
    return "\n\n" + "\n".join(lines) if lines else ""


def _order(name: str) -> tuple[int, str]:
    first = name.split()[0].split(".")[0]
    rank = {"supervisor": 0, "runner": 0, "rollout": 1, "inference": 2, "sink": 3, "learner": 3}
    return rank.get(first, 4), name


def verdict(results: dict[str, tt.Window], gpu: bool = False) -> str:
    """The issues' checks, one line each (on a GPU its own goals)."""
    lines = []
    if gpu and "train" in results and "sim" in results:
        share = results["train"].rate / results["sim"].rate
        lines.append(f"Full training: {share:.0%} of pure simulation "
                     f"(goal: at least {GPU_GOALS['share']:.0%}).")
    if "train" in results and "sim_short" in results:
        share = results["train"].rate / results["sim_short"].rate
        lines.append(f"Full training: {share:.0%} of pure simulation with short episodes.")
    if "sim" in results and "random" in results:
        share = results["random"].rate / results["sim"].rate
        lines.append(f"Sampler with random actions: {share:.0%} of pure simulation "
                     f"(goal: at least 90%).")
    for key, (versus, goal) in VERSUS.items():
        goal = GPU_GOALS.get(key, goal) if gpu else goal
        if key in results and versus in results:
            ratio = results[key].rate / results[versus].rate
            lines.append(f"{CASES[key].capitalize()}: {_k(results[key].rate)} env frames/s vs "
                         f"{_k(results[versus].rate)}, {ratio:.2f}x Sample Factory "
                         f"(goal: at least {goal:g}x).")
    return "\n".join(f"- {line}" for line in lines)


def machine() -> str:
    """This machine and the library versions this benchmark depends on (and its GPU)."""
    import torch
    import vizdoom

    gpu = ""
    if torch.cuda.is_available():
        gpu = (f", {torch.cuda.get_device_name()} (CUDA {torch.version.cuda}, driver "
               f"{_driver()})")
    return machine_line(f"torch {torch.__version__}, vizdoom {vizdoom.__version__}{gpu}")


def _driver() -> str:
    """The NVIDIA driver's version, or ``unknown``."""
    # "NVRM version: NVIDIA UNIX [Open ]Kernel Module for x86_64  580.159.04  Release Build ..."
    with contextlib.suppress(OSError):
        if found := re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s",
                              Path("/proc/driver/nvidia/version").read_text()):
            return found.group(1)
    return "unknown"


def write_docs(text: str, gpu: bool = False) -> None:
    """Replace this benchmark's section of docs/benchmarks/throughput_cpu.md (its GPU section of
    docs/benchmarks/gpu.md)."""
    write_section(*((DOC_GPU, SECTION_GPU) if gpu else (DOC, SECTION)), text)


def main(argv: list[str] | None = None) -> int:
    """Run the cases in turn, print the tables, optionally rewrite the docs section."""
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, help="measured window per case (default 30)")
    parser.add_argument("--warmup", type=float, help="seconds after the first frames (def. 10)")
    parser.add_argument("--workers", type=int, default=2, help="rollout workers, one core each")
    parser.add_argument("--envs", type=int, default=16, help="envs per worker")
    parser.add_argument("--env", default="doom_basic", help="env name (sfbus_components.envs)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of "
                        + ", ".join(CASES))
    parser.add_argument("--short-episodes", type=int, default=6, metavar="N",
                        help="episode length of the sim_short case, in agent steps (default 6: "
                        "a trained doom_basic agent's)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 s warm-up, 4 s window")
    parser.add_argument("--gpu", action="store_true", help="train on the GPU layout "
                        f"({tt.TRAINING_GPU}, device cuda) and Sample Factory with --device=gpu")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra override of the sfbus training case (repeatable), e.g. "
                        "processes.inference.replicas=2")
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite its section of docs/benchmarks/")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (4.0 if args.quick else 30.0)
    args.warmup = args.warmup if args.warmup is not None else (3.0 if args.quick else 10.0)
    keys = [k.strip() for k in args.cases.split(",") if k.strip()]
    if unknown := [k for k in keys if k not in CASES]:
        parser.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    if args.short_episodes < 1:
        parser.error(f"--short-episodes must be at least 1, got {args.short_episodes}")
    results: dict[str, tt.Window] = {}
    for key in keys:
        results[key] = w = run_case(key, args)
        print(f"{CASES[key]:>24} | {w.rate:>9,.0f} env frames/s | "
              f"{w.cores:.2f} cores (others {w.others:.2f}) | start-up {w.startup_s:.1f} s",
              flush=True)
    text = (f"{verdict(results, args.gpu)}\n\n{rate_table(results)}\n\n{cpu_table(results)}"
            f"{inference_passes(results)}")
    print("\n" + text)
    if args.write_docs:
        command = "python -m bench.throughput " + " ".join(argv if argv is not None
                                                           else sys.argv[1:])
        sets = " ".join(training_sets(args))
        about = (ABOUT_GPU if args.gpu else ABOUT) % dict(
            workers=args.workers, envs=args.envs, seconds=args.seconds, warmup=args.warmup,
            training=training(args), sets=sets, short=args.short_episodes)
        write_docs(f"Command: `{command.strip()}`\n\nMachine: {machine()}\n\n{about}\n\n{text}\n",
                   args.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
