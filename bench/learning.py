"""Learning speed of the default run: env frames and wall time to reach doom_basic's reward bars.

``python -m bench.learning [--frames 1000000] [--config NAME[@TOPOLOGY]=SET[,SET...]]...
[--write-docs]`` trains ``topologies/doom_basic.yaml`` (or ``TOPOLOGY``) once per configuration,
one after another (a configuration is a name and ``--set`` overrides; the default compares the
encoder in bfloat16 with float32), reads each run's ``progress.jsonl`` (the 100-episode mean of
VizDoom's own reward) and reports when each reached the bars, the final reward and the frame
rate. ``--write-docs`` rewrites its section of docs/benchmarks/learning_doom_basic.md and draws
the runs into ``docs/benchmarks/doom_basic_learning*``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import throughput
from bench.report import DOCS, write_section
from sfbus_components.commands.plot import Progress, plot_runs, read_progress

ROOT = Path(__file__).resolve().parents[1]
DOC = "learning_doom_basic.md"
SECTION = "## Learning speed: doom_basic (the default run)"
TOPOLOGY = "topologies/doom_basic.yaml"
BARS = (50.0, 70.0)
DEFAULT_CONFIGS = ("bfloat16=model.precision=bfloat16", "float32=model.precision=float32")
# Sample Factory 2.1.1 on this machine, from the issue: frames and seconds to each bar.
SAMPLE_FACTORY = {50.0: "~350k frames, 125 s", 70.0: "~500k frames, 170 s"}


def parse_config(text: str) -> tuple[str, str, list[str]]:
    """``name[@file]=a.b=1,c=2`` -> (name, file or the default topology, ["a.b=1", "c=2"])."""
    label, _, sets = text.partition("=")
    name, _, topology = label.partition("@")
    return name, topology or TOPOLOGY, [s for s in sets.split(",") if s]


def train(name: str, topology: str, sets: list[str], frames: int, tmp: Path,
          python: str = sys.executable, root: Path = ROOT) -> Progress:
    """Run ``topology`` to ``frames`` env frames with ``sets`` (the checkout in ``root`` under
    ``python``); its progress records."""
    run_dir = tmp / name
    args = [python, "-m", "sfbus", "run", topology, "--max-frames", str(frames),
            "--run-dir", str(run_dir)] + [a for s in sets for a in ("--set", s)]
    print(f"{name}: {' '.join(args[2:])}", flush=True)
    subprocess.run(args, cwd=root, check=True, stdout=subprocess.DEVNULL)
    run = read_progress(run_dir)
    run.name = name
    return run


def first_report(run: Progress, bar: float) -> int | None:
    """Index of the first report whose mean reward is at least ``bar``."""
    return next((i for i, record in enumerate(run.policies)
                 if record.get("0", {}).get("reward", -float("inf")) >= bar), None)


def reached(run: Progress, bar: float) -> tuple[int, float] | None:
    """(env frames, seconds) of the first report whose mean reward is at least ``bar``."""
    index = first_report(run, bar)
    return None if index is None else (run.frames[index], run.time[index])


def final_reward(run: Progress) -> float:
    """The last reported mean reward."""
    rewards = run.series("0", "reward", "frames")[1]
    return rewards[-1] if rewards else float("nan")


def last_minute_fps(run: Progress) -> float:
    """Env frames per second over the run's last 60 s."""
    end_t, end_f = run.time[-1], run.frames[-1]
    start = next(i for i, t in enumerate(run.time) if t >= end_t - 60.0)
    return (end_f - run.frames[start]) / max(end_t - run.time[start], 1e-9)


def table(runs: list[Progress], sample_factory: bool = True) -> str:
    """Markdown: one row per bar, columns per run, then (optionally) Sample Factory's figures."""
    sf_head, sf_rule = (" Sample Factory 2.1.1 |", " ---: |") if sample_factory else ("", "")
    head = "| mean reward reached | " + " | ".join(f"{r.name}: env frames, wall time"
                                                 for r in runs) + " |" + sf_head
    rule = "| --- | " + " | ".join("---:" for _ in runs) + " |" + sf_rule
    rows = []
    for bar in BARS:
        cells = []
        for run in runs:
            hit = reached(run, bar)
            cells.append("not reached" if hit is None else f"{hit[0] / 1e3:,.0f}k, {hit[1]:.0f} s")
        sf = f" {SAMPLE_FACTORY[bar]} |" if sample_factory else ""
        rows.append(f"| {bar:g} | " + " | ".join(cells) + " |" + sf)
    rows.append("| final mean reward | " + " | ".join(
        f"{final_reward(r):.1f} at {r.frames[-1] / 1e3:,.0f}k, {r.time[-1]:.0f} s" for r in runs)
        + " |" + (" |" if sample_factory else ""))
    rows.append("| env frames/s, last minute | " + " | ".join(
        f"{last_minute_fps(r):,.0f}" for r in runs) + " |" + (" ~3.0k |" if sample_factory else ""))
    return "\n".join([head, rule, *rows])


def main(argv: list[str] | None = None) -> int:
    """Train each configuration in turn and report (and optionally write) the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1_000_000, help="env frames per run")
    parser.add_argument("--config", action="append", help="NAME[@TOPOLOGY]=SET[,SET...]; "
                        f"repeatable (default: {' and '.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs section")
    args = parser.parse_args(argv)
    configs = [parse_config(c) for c in (args.config or DEFAULT_CONFIGS)]
    with tempfile.TemporaryDirectory(prefix="sfbus-learning-") as tmp:
        runs = [train(name, topology, sets, args.frames, Path(tmp))
                for name, topology, sets in configs]
        text = table(runs)
        print("\n" + text)
        if args.write_docs:
            for path in plot_runs(runs, Path(tmp, "plots")):
                if path.stem in ("reward_vs_frames", "reward_vs_time"):
                    suffix = "" if path.stem == "reward_vs_frames" else "_time"
                    (DOCS / f"doom_basic_learning{suffix}.png").write_bytes(
                        path.read_bytes())
            command = "python -m bench.learning " + " ".join(
                sys.argv[1:] if argv is None else argv)
            sets = "; ".join(f"{n}: {'' if t == TOPOLOGY else t + ' '}{' '.join(s) or 'defaults'}"
                             for n, t, s in configs)
            write_section(DOC, SECTION, (
                f"Command: `{command.strip()}` — each configuration trains `sfbus run {TOPOLOGY} "
                f"--max-frames {args.frames}` (or the topology it names) with its `--set`s "
                f"({sets}), one after another; "
                f"the reward is the 100-episode mean of VizDoom's own reward for `basic` from "
                f"the run's `progress.jsonl`. One run per configuration (seed 0 unless it sets "
                f"one).\n\nMachine: {throughput.machine()}"
                f"\n\n{text}\n\n![doom_basic: mean episode reward vs env frames]"
                f"(doom_basic_learning.png)\n\n![doom_basic: mean episode reward vs wall time]"
                f"(doom_basic_learning_time.png)\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
