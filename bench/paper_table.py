"""Table 1 of the paper on this machine: pure simulation, Sample Factory and sfbus training.

``python -m bench.paper_table [--seconds 120] [--warmup 30] [--workers N] [--envs 16]
[--games atari_breakout,doom_benchmark] [--gpu] [--write-docs] [--quick]`` measures, for Atari
Breakout (84x84 grey, 4-frame stack) and VizDoom Battle as the paper benchmarks it
(``doom_benchmark``: 128x72x3, one head, no measurements), one case after another, each in fresh
processes:

1. pure simulation: random actions in ``--workers`` processes (default: every core), each pinned
   to its core (``bench.throughput.pure_simulation``);
2. Sample Factory 2.1.1's full training (``bench.sample_factory``), from its own venv;
3. sfbus's full training, ``topologies/doom_basic.yaml`` (``doom_basic_gpu.yaml`` with ``--gpu``)
   with the env, workers and envs given here.

Both trainers run the paper's *simplified* model for both games (a 3-layer conv, a fully connected
layer, a GRU of 512, the two heads: sfbus's ``conv_simple``, Sample Factory's ``convnet_simple``),
asynchronous APPO, rollout 32, batch 1024, one epoch of one minibatch, GAE, ELU: Sample Factory's
Atari defaults (synchronous, 4 epochs of 4 minibatches, ReLU, no RNN) are overridden to that.
Each rate is taken over ``--seconds`` (at least two minutes unless ``--quick``) after a warm-up of
``--warmup`` seconds from the first frames; it prints env frames/s and the share of pure
simulation as Table 1 does, the ratio sfbus / Sample Factory, and the issue's goals for this
machine, and with ``--write-docs`` records them in docs/benchmarks/paper_table.md after each game.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench import sample_factory
from bench import throughput as tp
from bench import throughput_topologies as tt
from bench.report import cpu_flags, write_section

GAMES = {"atari_breakout": "Atari Breakout (84x84x4)",
         "doom_benchmark": "VizDoom Battle, doom_benchmark (128x72x3)"}
ROWS = {"sim": "Pure simulation", "sf_train": "Sample Factory 2.1.1 APPO", "train": "sfbus"}
PAPER = {"atari_breakout": (181740, 135893), "doom_benchmark": (322907, 146551)}
"""The paper's Table 1 on its System #2 (36 cores, one RTX 2080 Ti): pure simulation and Sample
Factory's env frames/s."""
# The same learner work as sfbus's doom_basic.yaml: asynchronous APPO, one epoch of one
# minibatch over the whole rollout, GAE, ELU, the conv + GRU model (sf_flags sets the rest).
SF_FLAGS = ("--async_rl=True", "--num_epochs=1", "--num_batches_per_epoch=1", "--recurrence=32",
            "--with_vtrace=False", "--nonlinearity=elu", "--normalize_input=True",
            "--normalize_returns=True")
DOC = "paper_table.md"
SECTION = "## Table 1: Breakout and Battle as the paper measures them"
SECTION_GPU = "## Table 1 on a GPU: Breakout and Battle as the paper measures them"


def run_case(key: str, game: str, args: argparse.Namespace) -> tt.Window:
    """One case of one game, in fresh processes, measured."""
    if key == "sim":
        return tp.pure_simulation(game, args.workers, args.envs, args.warmup, args.seconds)
    if key == "sf_train":
        return sample_factory.run_training(args.seconds, args.warmup, env=game,
                                           workers=args.workers, envs=args.envs,
                                           device=sf_device(args),
                                           extra_flags=SF_FLAGS)
    sets = tt.training_overrides(game, args.workers, args.envs, args.set)
    if args.gpu:
        sets += ["--set", "device=cuda"]
    with tempfile.TemporaryDirectory(prefix="sfbus-bench-") as tmp:
        return tt.run_sfbus([training(args), *sets], args.warmup, args.seconds, Path(tmp))


def sf_device(args: argparse.Namespace) -> str:
    """Sample Factory's ``--device`` for this run."""
    return "gpu" if args.gpu else "cpu"


def training(args: argparse.Namespace) -> str:
    """The sfbus topology that trains: the GPU layout with ``--gpu``."""
    return tt.TRAINING_GPU if args.gpu else tt.TRAINING


def fast_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (and is not told to act as AVX2-only)."""
    emulated = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper().startswith("AVX2")
    return not emulated and bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def table(results: dict[str, dict[str, tt.Window]]) -> str:
    """Table 1's rows for the games measured: env frames/s and the share of pure simulation."""
    games = list(results)
    rows = ["| | " + " | ".join(f"{GAMES[g]}, env frames/s" for g in games) + " |",
            "| --- |" + " ---: |" * len(games)]
    for key, label in ROWS.items():
        cells = []
        for game in games:
            w, sim = results[game].get(key), results[game].get("sim")
            share = f" ({w.rate / sim.rate:.1%})" if w and sim and sim.rate else ""
            cells.append(f"{w.rate:,.0f}{share}" if w else "")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    ratios = [f"{r['train'].rate / r['sf_train'].rate:.2f}x" if {"train", "sf_train"} <= set(r)
              else "" for r in results.values()]
    rows.append("| sfbus / Sample Factory | " + " | ".join(ratios) + " |")
    paper = [f"{PAPER[g][1]:,} ({PAPER[g][1] / PAPER[g][0]:.1%})" for g in games]
    rows.append("| *the paper's Sample Factory (36 cores, RTX 2080 Ti)* | " + " | ".join(paper)
                + " |")
    return "\n".join(rows)


def goals(results: dict[str, dict[str, tt.Window]], gpu: bool) -> str:
    """The issue's goals for this machine, one line per game."""
    lines = []
    for game, r in results.items():
        if not {"train", "sf_train"} <= set(r):
            continue
        ratio = r["train"].rate / r["sf_train"].rate
        if gpu:
            share_goal = 0.8 if game.startswith("atari_") else 0.6
            share = r["train"].rate / r["sim"].rate if "sim" in r else float("nan")
            lines.append(f"{GAMES[game]}: {share:.1%} of pure simulation (goal {share_goal:.0%}),"
                         f" {ratio:.2f}x Sample Factory (goal 1.5x)")
        else:
            goal = 2.5 if fast_bf16() else 2.0
            kind = "a CPU with fast bfloat16" if fast_bf16() else "an AVX2-only CPU"
            lines.append(f"{GAMES[game]}: {ratio:.2f}x Sample Factory (goal on {kind}: "
                         f"{goal:g}x)")
    return "\n".join(f"- {line}" for line in lines)


def details(results: dict[str, dict[str, tt.Window]]) -> str:
    """Each game's cores and memory per case, and sfbus's inference passes and waits, as
    ``bench.throughput`` reports them."""
    parts = []
    for game, r in results.items():
        parts.append(f"{GAMES[game]}:\n\n{tp.rate_table(r)}\n\n{tp.cpu_table(r)}"
                     f"{tp.inference_passes(r)}")
    return "\n\n".join(parts)


def about(args: argparse.Namespace) -> str:
    """How the figures were taken, for the docs."""
    flags = " ".join(f for f in sample_factory.sf_flags("GAME", args.workers, args.envs,
                                                        Path("DIR"), device=sf_device(args))
                     if not f.startswith(("--train_dir", "--experiment", "--with_wandb")))
    device = "--set device=cuda (the GPU layout)" if args.gpu else "(the CPU layout)"
    return (f"Each case in fresh processes, one after another: {args.workers} rollout workers "
            f"(or simulation processes) of {args.envs} envs, each pinned to its own core; a rate "
            f"is env frames (agent steps x 4) per second over {args.seconds:g} s after "
            f"{args.warmup:g} s of warm-up from the first frames. *Pure simulation* steps the "
            "envs with random actions into preallocated rows (sfbus's own env and resize; each "
            "process and its engines under SCHED_BATCH, the simulation's fastest), nothing "
            f"else. *sfbus* is `sfbus run {training(args)}` with `env`, `num_envs` and "
            f"the workers set {device}. *Sample Factory* runs from its own venv with `{flags} "
            f"{' '.join(SF_FLAGS)}`. The paper's row is its Table 1 (System #2), for scale: its "
            "machine had 36 cores and a GPU.")


def main(argv: list[str] | None = None) -> int:
    """Measure every case of every game, print Table 1, optionally record it."""
    parser = argparse.ArgumentParser(prog="python -m bench.paper_table", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, help="measured window per case (default 120)")
    parser.add_argument("--warmup", type=float, help="seconds after the first frames (def. 30)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="rollout workers, one core each (default: every core)")
    parser.add_argument("--envs", type=int, default=16, help="envs per worker (default 16)")
    parser.add_argument("--games", default=",".join(GAMES),
                        help="comma-separated subset of " + ", ".join(GAMES))
    parser.add_argument("--cases", default=",".join(ROWS),
                        help="comma-separated subset of " + ", ".join(ROWS))
    parser.add_argument("--gpu", action="store_true", help="train on the GPU layout "
                        f"({tt.TRAINING_GPU}, device cuda), Sample Factory with --device=gpu")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra override of the sfbus case (repeatable)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 s warm-up, 5 s window")
    parser.add_argument("--write-docs", action="store_true",
                        help="record the table in docs/benchmarks/paper_table.md after each game")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (5.0 if args.quick else 120.0)
    args.warmup = args.warmup if args.warmup is not None else (3.0 if args.quick else 30.0)
    games = [g.strip() for g in args.games.split(",") if g.strip()]
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if unknown := [g for g in games if g not in GAMES] + [c for c in cases if c not in ROWS]:
        parser.error(f"unknown game(s) or case(s) {unknown}; games: {list(GAMES)}, cases: "
                     f"{list(ROWS)}")
    if args.seconds < 120 and not args.quick:
        parser.error("the paper's figures average minutes: --seconds must be at least 120 "
                     "(or --quick for a smoke run)")
    if args.workers < 1 or args.envs < 1:
        parser.error("--workers and --envs must be at least 1")
    results: dict[str, dict[str, tt.Window]] = {}
    command = "python -m bench.paper_table " + " ".join(argv if argv is not None else sys.argv[1:])
    for game in games:
        results[game] = {}
        for key in cases:
            results[game][key] = w = run_case(key, game, args)
            print(f"{game:>16} {ROWS[key]:>26} | {w.rate:>9,.0f} env frames/s | {w.cores:.2f} "
                  f"cores (others {w.others:.2f}) | start-up {w.startup_s:.1f} s", flush=True)
        text = f"{table(results)}\n\n{goals(results, args.gpu)}"
        print("\n" + text + "\n", flush=True)
        if args.write_docs:  # after each game: a long run keeps what it has measured
            write_section(DOC, SECTION_GPU if args.gpu else SECTION,
                          f"Command: `{command.strip()}`\n\nMachine: {tp.machine()}\n\n"
                          f"{about(args)}\n\n{text}\n\n{details(results)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
