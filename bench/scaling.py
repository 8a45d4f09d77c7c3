"""How throughput scales with the number of environments: the paper's Figure 3 on this machine.

``python -m bench.scaling [--envs 8,16,32,64,128] [--cases model,train] [--seconds S]
[--write-docs]`` runs, for each total number of envs (split evenly over ``--workers`` rollout
workers, one per core), the cases of :mod:`bench.throughput` (the sampler with the real model and
full training by default), one after another in fresh processes, and prints env frames/s as a
table; ``--write-docs`` also rewrites its section of docs/benchmarks/scaling.md and draws
``docs/benchmarks/scaling.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import throughput
from bench.report import DOCS, write_section

DOC = "scaling.md"
SECTION = "## Scaling: env frames/s vs environments sampled"
PLOT = DOCS / "scaling.png"


def table(cases: list[str], envs: list[int], rates: dict[tuple[str, int], float]) -> str:
    """Markdown table: one row per env count, one column per case."""
    head = "| envs sampled | " + " | ".join(throughput.CASES[c] for c in cases) + " |"
    rule = "| ---: | " + " | ".join("---:" for _ in cases) + " |"
    rows = [f"| {n} | " + " | ".join(f"{rates[c, n]:,.0f}" for c in cases) + " |" for n in envs]
    return "\n".join([head, rule, *rows])


def plot(cases: list[str], envs: list[int], rates: dict[tuple[str, int], float],
         path: Path) -> None:
    """Env frames/s vs envs sampled, one line per case, log-2 x axis as in the paper."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for case in cases:
        axes.plot(envs, [rates[case, n] for n in envs], marker="o", label=throughput.CASES[case])
    axes.set_xscale("log", base=2)
    axes.set_xticks(envs, [str(n) for n in envs])
    axes.set_xlabel("environments sampled")
    axes.set_ylabel("env frames/s")
    axes.set_title("sfbus on doom_basic")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Run every (case, env count) pair in turn and report the table (and docs, plot)."""
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="8,16,32,64,128", help="total env counts")
    parser.add_argument("--cases", default="model,train", help="cases of bench.throughput")
    parser.add_argument("--workers", type=int, default=2, help="rollout workers, one core each")
    parser.add_argument("--env", default="doom_basic", help="env name (sfbus_components.envs)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after first frames")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs section")
    args = parser.parse_args(argv)
    envs = [int(n) for n in args.envs.split(",")]
    cases = [c.strip() for c in args.cases.split(",")]
    if bad := [c for c in cases if c not in throughput.CASES]:
        parser.error(f"unknown case(s) {bad}; known: {list(throughput.CASES)}")
    if bad := [n for n in envs if n % args.workers]:
        parser.error(f"env counts {bad} do not split evenly over {args.workers} workers")
    rates: dict[tuple[str, int], float] = {}
    for n in envs:
        for case in cases:
            run = argparse.Namespace(**{**vars(args), "envs": n // args.workers})
            window = throughput.run_case(case, run)
            rates[case, n] = window.rate
            print(f"{n:>4} envs | {throughput.CASES[case]:>20} | {window.rate:>9,.0f} env "
                  f"frames/s | {window.cores:.2f} cores (others {window.others:.2f})",
                  flush=True)
    text = table(cases, envs, rates)
    print("\n" + text)
    if args.write_docs:
        plot(cases, envs, rates, PLOT)
        command = "python -m bench.scaling " + " ".join(sys.argv[1:] if argv is None else argv)
        about = (f"{args.workers} rollout workers, one per core, the envs split evenly between "
                 f"them; each run in fresh processes, its rate over a {args.seconds:g} s window "
                 f"{args.warmup:g} s after the first frames (as in the throughput section). "
                 f"The paper's Figure 3 shape: throughput rises with envs sampled until the "
                 f"cores are busy, then flattens.")
        write_section(DOC, SECTION, f"Command: `{command.strip()}`\n\nMachine: "
                               f"{throughput.machine()}\n\n{about}\n\n{text}\n\n"
                               f"![frames/s vs envs](scaling.png)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
