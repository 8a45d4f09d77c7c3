"""The default run before and after a change: `make run`'s training with two checkouts, in turns.

``python -m bench.before_after --base-root DIR --base-python PY [--frames 1000000] [--rounds 2]
[--write-docs]`` trains ``topologies/doom_basic.yaml`` (what ``make run`` trains on a CPU machine)
with the checkout in ``DIR`` under the interpreter ``PY`` (a venv where that checkout is installed),
then with this checkout, ``--rounds`` times in turn, so that both sides share the machine's
noisy stretches; round r runs both with seed r. It reports per run when the 100-episode mean
reward reached doom_basic's bars, the final reward and the frame rate of the last minute
(``bench.learning``'s table).

Preparing the base, e.g. for the code before the house of issue #40::

    git worktree add --detach /tmp/base 7522df7
    python3 -m venv /tmp/basevenv && /tmp/basevenv/bin/pip install torch==2.13.0
    /tmp/basevenv/bin/pip install -e '/tmp/base[test]'
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import learning, throughput
from bench.report import write_section

SECTION = "## The default run before and after a change"


def main(argv: list[str] | None = None) -> int:
    """Train both checkouts in turn and report (and optionally write) the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.before_after", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-root", type=Path, required=True, help="the base checkout")
    parser.add_argument("--base-python", type=Path, required=True,
                        help="an interpreter with the base checkout installed")
    parser.add_argument("--frames", type=int, default=1_000_000, help="env frames per run")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs per side, in turn, seeds 0, 1, ...")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs section")
    args = parser.parse_args(argv)
    base_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.base_root,
                              capture_output=True, text=True, check=True).stdout.strip()
    this_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=learning.ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    sides = [(f"before ({base_rev})", str(args.base_python), args.base_root),
             (f"after ({this_rev})", sys.executable, learning.ROOT)]
    with tempfile.TemporaryDirectory(prefix="sfbus-before-after-") as tmp:
        runs = [learning.train(f"{name} seed {seed}", learning.TOPOLOGY, [f"seed={seed}"],
                               args.frames, Path(tmp), python=python, root=root)
                for seed in range(args.rounds) for name, python, root in sides]
        text = learning.table(runs, sample_factory=False)
        print("\n" + text)
        if args.write_docs:
            command = "python -m bench.before_after " + " ".join(
                sys.argv[1:] if argv is None else argv)
            write_section(learning.DOC, SECTION, (
                f"Command: `{command.strip()}` — `sfbus run {learning.TOPOLOGY} --max-frames "
                f"{args.frames}` with the base checkout ({base_rev}, under its own venv) and with "
                f"this one ({this_rev}), {args.rounds} times in turn (seeds 0, 1, ...), one run "
                f"at a time; "
                f"the reward is the 100-episode mean of VizDoom's own reward for `basic`.\n\n"
                f"Machine: {throughput.machine()}\n\n{text}\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
