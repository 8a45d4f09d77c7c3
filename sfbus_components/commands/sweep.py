"""``sfbus sweep FILE --grid KEY=V1,V2 ...``: one run per combination of settings.

The cross product of the ``--grid`` values, each combination one ``sfbus run FILE --set ...``
with its own run directory ``SWEEP_DIR/<nn>-<key=value,...>`` and its console output in
``SWEEP_DIR/<nn>-<...>.log``, ``--parallel`` at a time. Every combination is validated before
anything starts. Metrics servers are off (``--metrics-port 0``): runs side by side would ask for
the same port; progress.jsonl and TensorBoard hold the same figures. ``SWEEP_DIR/sweep.json``
lists the combinations, their run directories and, as they end, their exit codes;
``sfbus plot SWEEP_DIR`` draws them together.

``--slurm OUT.sh`` writes a Slurm array job instead (task ``i`` runs combination ``i``;
``--parallel N`` becomes the array's ``%N`` limit) and runs nothing.

Ctrl-C (or SIGTERM) stops every run gracefully (one SIGINT each, their final checkpoints
written; SIGKILL after ``STOP_GRACE_S``) and exits 130. Exit 0 only when every run exited 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sfbus import STOP_WITH_PARENT_ENV, BadInput
from sfbus_components.commands.outputs import check_writable_file

MAX_RUNS = 10_000  # each combination is validated first (~25 ms each)
STOP_GRACE_S = 120.0  # a run's own graceful stop saves checkpoints; then it is killed


@dataclass
class Combination:
    """One run of the sweep."""

    name: str
    overrides: list[str]
    """``KEY=VALUE`` of the grid for this run (the fixed ``--set`` come first)."""
    run_dir: Path
    exit_code: int | None = None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` sub-command (the ``sfbus.commands`` entry point)."""
    parser = subparsers.add_parser(
        "sweep", help="run a topology once per combination of settings",
        description="Run the cross product of --grid values as separate runs (or write a Slurm "
                    "array job for them); `sfbus plot SWEEP_DIR` compares them.")
    parser.add_argument("topology", help="topology YAML file")
    parser.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2,...",
                        help="a setting and its values (repeatable; commas inside [..] or "
                             "{..} belong to one value)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting shared by every run (repeatable)")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="runs at a time (default: 1)")
    parser.add_argument("--sweep-dir", metavar="DIR",
                        help="folder of the sweep (default: runs/sweep-<topology>-<time>)")
    parser.add_argument("--max-frames", type=int, default=None, help="passed to every run")
    parser.add_argument("--max-seconds", type=float, default=None, help="passed to every run")
    parser.add_argument("--slurm", metavar="OUT.sh",
                        help="write a Slurm array script for the sweep instead of running it")
    parser.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Validate every combination, then run them (or write the Slurm script)."""
    from sfbus import validate_topology

    if args.parallel < 1:
        raise BadInput(f"--parallel must be >= 1, not {args.parallel}")
    for name, value in (("--max-frames", args.max_frames), ("--max-seconds", args.max_seconds)):
        # as `sfbus run` checks them: a value every run would refuse fails the sweep here
        if value is not None and not 0 < value < math.inf:
            raise BadInput(f"{name} must be a finite number > 0, not {value}")
    grids = [parse_grid(text) for text in args.grid]
    keys = [key for key, _ in grids]
    if len(set(keys)) < len(keys):
        raise BadInput(f"--grid: a key is given twice ({', '.join(keys)})")
    count = math.prod(len(values) for _, values in grids)
    if count > MAX_RUNS:  # before the product is built: 10 grids of 10 values would not fit
        raise BadInput(f"--grid: {' x '.join(str(len(v)) for _, v in grids)} = {count:,} runs; "
                       f"a sweep holds at most {MAX_RUNS:,} (split it into several)")
    topology = None
    combos = list(itertools.product(*(values for _, values in grids)))
    names = [f"{i:02d}-" + safe_name(",".join(f"{k}={v}" for k, v in zip(keys, combo,
                                                                           strict=True)))
             for i, combo in enumerate(combos)]
    for name, combo in zip(names, combos, strict=True):
        overrides = [*args.set, *(f"{k}={v}" for k, v in zip(keys, combo, strict=True))]
        try:  # as `sfbus run` would check it here (on a cluster: as `sfbus validate` does)
            topology = validate_topology(args.topology, overrides, free=args.slurm is None)
        except BadInput as error:
            raise BadInput(f"sweep combination {name}: {error}") from None
    assert topology is not None
    if args.slurm is not None:
        check_writable_file(Path(args.slurm), "--slurm", make_folder=False)
        # the folder's name and path go into #SBATCH comment lines, where shell quoting does not
        # hold: a newline would end the comment and run the rest as a command of the script
        for name, text in (("--sweep-dir", args.sweep_dir or ""),
                           ("the working directory", str(Path.cwd())),
                           ("the topology's name", topology.name)):
            if any(ord(char) < 32 or ord(char) == 127 for char in text):
                raise BadInput(f"--slurm: {name} {text!r} holds a control character (a newline?),"
                               " which cannot be written into the script's #SBATCH lines")
    made = not args.sweep_dir or not Path(args.sweep_dir).exists()
    sweep_dir = _make_sweep_dir(args.sweep_dir, topology.name)
    runs = [Combination(name, [f"{k}={v}" for k, v in zip(keys, combo, strict=True)],
                        sweep_dir / name) for name, combo in zip(names, combos, strict=True)]
    record = {"topology": str(Path(args.topology).resolve()), "grids": dict(grids),
              "set": args.set, "runs": runs}
    if args.slurm is not None:
        try:
            # sweep.json too: `sfbus plot SWEEP_DIR` finds the array's runs by it
            save_record(sweep_dir, record)
            write_slurm(Path(args.slurm), sweep_dir,
                        [command(args, run, "sfbus") for run in runs], args.parallel)
        except OSError as error:  # checked writable above; gone or full since
            (sweep_dir / "sweep.json").unlink(missing_ok=True)
            if made:
                shutil.rmtree(sweep_dir, ignore_errors=True)
            raise BadInput(f"--slurm {args.slurm}: cannot write it: "
                           f"{error.strerror or error}") from None
        print(f"{args.slurm}: Slurm array of {len(runs)} runs into {sweep_dir} "
              f"(sbatch {args.slurm})")
        return 0
    return run_all(args, runs, sweep_dir, record)


def _make_sweep_dir(given: str | None, topology_name: str) -> Path:
    """The sweep's folder, made now (``--sweep-dir``: new or empty)."""
    from sfbus import make_private_dir, new_run_dir

    if not given:
        try:
            return new_run_dir(f"sweep-{safe_name(topology_name)}")  # one folder under runs/
        except OSError as error:
            raise BadInput(f"cannot make the sweep's folder under runs/: "
                           f"{error.strerror or error}") from None
    sweep_dir = Path(given)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise BadInput(f"--sweep-dir {sweep_dir}: not a directory")
    if sweep_dir.is_dir() and any(sweep_dir.iterdir()):
        raise BadInput(f"--sweep-dir {sweep_dir}: not empty; choose a new folder")
    try:
        make_private_dir(sweep_dir)
    except OSError as error:
        raise BadInput(f"--sweep-dir {sweep_dir}: cannot make it: "
                       f"{error.strerror or error}") from None
    return sweep_dir


def parse_grid(text: str) -> tuple[str, list[str]]:
    """``KEY=V1,V2`` into (KEY, [V1, V2]); commas inside brackets or braces stay in a value."""
    key, sep, values = text.partition("=")
    if not sep or not key.strip():
        raise BadInput(f"--grid {text!r}: expected KEY=V1,V2,...")
    parts, depth, current = [], 0, ""
    for char in values:
        depth += char in "[{"
        depth -= char in "]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    if any(not p.strip() for p in parts):
        raise BadInput(f"--grid {text!r}: an empty value")
    return key.strip(), [p.strip() for p in parts]


def safe_name(text: str) -> str:
    """``text`` as one file name: anything but letters, digits and ``=.,+-_`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9=.,+\-_]", "_", text)[:120]


def command(args: argparse.Namespace, run: Combination, program: str) -> list[str]:
    """The command line of one run; ``program`` starts sfbus (a path or ``python -m``)."""
    line = [*shlex.split(program), "--app-dir", str(Path(args.app_dir).resolve()), "run",
            str(Path(args.topology).resolve())]
    for override in [*args.set, *run.overrides]:
        line += ["--set", override]
    line += ["--run-dir", str(run.run_dir.resolve()), "--metrics-port", "0"]
    if args.max_frames is not None:
        line += ["--max-frames", str(args.max_frames)]
    if args.max_seconds is not None:
        line += ["--max-seconds", str(args.max_seconds)]
    return line


def write_slurm(out: Path, sweep_dir: Path, commands: list[list[str]], parallel: int) -> None:
    """A Slurm array script: task ``i`` runs ``commands[i]``."""
    cases = "\n".join(f"  {i}) exec {shlex.join(line)} ;;" for i, line in enumerate(commands))
    limit = f"%{parallel}" if parallel > 1 else ""
    out.write_text(f"""#!/bin/bash
#SBATCH --job-name={shlex.quote(sweep_dir.name)}
#SBATCH --array=0-{len(commands) - 1}{limit}
#SBATCH --output={shlex.quote(str(sweep_dir.resolve()))}/slurm-%A_%a.log
# Written by `sfbus sweep`: task i runs combination i (see sweep.json beside the runs).
set -euo pipefail
case "${{SLURM_ARRAY_TASK_ID:?run this script with sbatch}}" in
{cases}
  *) echo "no combination $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;
esac
""")
    out.chmod(0o755)


def run_all(args: argparse.Namespace, runs: list[Combination], sweep_dir: Path,
            record: dict[str, Any]) -> int:
    """Run the combinations ``args.parallel`` at a time; the sweep's exit code."""
    save_record(sweep_dir, record)
    pending = list(runs)
    running: dict[subprocess.Popen, tuple[Combination, float, Any]] = {}
    stopping = False

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    print(f"sweep of {len(runs)} runs into {sweep_dir}, {args.parallel} at a time")
    try:
        while pending or running:
            while pending and len(running) < args.parallel:
                run = pending.pop(0)
                log = (sweep_dir / f"{run.name}.log").open("w")
                # a session of its own: a terminal's Ctrl-C reaches the sweep only, which then
                # stops each run once (a second SIGINT would force a run's stop)
                # ...and it stops when the sweep dies, even of a SIGKILL
                env = {**os.environ, STOP_WITH_PARENT_ENV: str(os.getpid())}
                child = subprocess.Popen(command(args, run, f"{sys.executable} -m sfbus"),
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)
                running[child] = (run, time.monotonic(), log)
                print(f"started {run.name}")
            time.sleep(0.2)
            for child in [c for c in running if c.poll() is not None]:
                run, started, log = running.pop(child)
                log.close()
                run.exit_code = child.returncode
                save_record(sweep_dir, record)
                print(f"finished {run.name}: exit {run.exit_code} "
                      f"({time.monotonic() - started:.0f} s)")
    except BaseException as error:  # Ctrl-C, SIGTERM, or a failure of the sweep itself
        stopping = isinstance(error, KeyboardInterrupt)
        print(f"stopping {len(running)} run(s)...", file=sys.stderr)
        stop_runs(running)
        save_record(sweep_dir, record)
        if not stopping:
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopping:
        return 130
    failed = [r for r in runs if r.exit_code != 0]
    if failed:
        print(f"error: {len(failed)} of {len(runs)} runs failed: "
              + ", ".join(f"{r.name} (exit {r.exit_code})" for r in failed), file=sys.stderr)
        return 1
    print(f"all {len(runs)} runs finished; compare them with: sfbus plot {sweep_dir}")
    return 0


def stop_runs(running: dict[subprocess.Popen, tuple[Combination, float, Any]]) -> None:
    """Stop every run gracefully (SIGINT), killing those still there after ``STOP_GRACE_S``."""
    for child in running:
        child.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    for child, (run, _, log) in running.items():
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()
        run.exit_code = child.returncode


def save_record(sweep_dir: Path, record: dict[str, Any]) -> None:
    """Write ``sweep.json`` (atomically: a reader never sees half of it)."""
    data = {**record, "runs": [{"name": r.name, "overrides": r.overrides,
                                "run_dir": str(r.run_dir), "exit_code": r.exit_code}
                               for r in record["runs"]]}
    temp = sweep_dir / ".sweep.json.tmp"
    temp.write_text(json.dumps(data, indent=2) + "\n")
    temp.replace(sweep_dir / "sweep.json")


def sweep_runs(sweep_dir: Path) -> list[Path]:
    """The run directories of the sweep in ``sweep_dir`` (its ``sweep.json``), in order."""
    data = json.loads((sweep_dir / "sweep.json").read_text())
    return [sweep_dir / Path(run["run_dir"]).name for run in data["runs"]]
