"""The ``sfbus`` command line.

Exit codes: 0 finished, 1 failed at run time, 2 bad input (nothing started), 130 interrupted.
Commands that need more than the kernel (``enjoy``, ``plot``, ...) register themselves under the
``sfbus.commands`` entry-point group, each naming a function ``register(subparsers)`` that adds
its sub-parser and sets ``func`` (taking the parsed args, returning the exit code); the kernel
never imports them by name. An entry named as its command is the only one loaded when that command
runs (the others may import torch: seconds per start); every one loads for help or a name no entry
has. Options of ``sfbus run`` that only components read (the several
nodes' ``--nodes``, ...) register the same way under ``sfbus.run_options``: a function
``register(run_parser)`` adds them and returns what applies them to the parsed arguments before
the run starts, returning a suffix for a new run directory's name ('' for none) or raising
``ValueError`` for bad input (exit 2).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import NoReturn

from sfbus.errors import BadInput, SfbusError

log = logging.getLogger("sfbus")

BAD_INPUT = 2


def _load(args: argparse.Namespace):
    from sfbus.validation import read_topology

    return read_topology(args.topology, getattr(args, "set", None) or ())


def cmd_run(args: argparse.Namespace) -> int:
    """Start a topology and supervise it until it ends."""
    from sfbus.launch import run

    try:
        suffix = "".join(apply(args) for apply in args.run_options)
    except ValueError as error:
        print(f"error: {one_line(str(error))}", file=sys.stderr)
        return BAD_INPUT
    overrides = [*(args.set or ()), *([f"seed={args.seed}"] if args.seed is not None else [])]
    return run(args.topology, overrides, run_dir=args.run_dir, resume=args.resume,
               max_seconds=args.max_seconds, max_frames=args.max_frames,
               metrics_port=args.metrics_port, serial=args.serial, name_suffix=suffix)


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a finite number of ``kind`` greater than 0."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _port(text: str) -> int:
    """An argparse type: a TCP port number, 0 meaning off."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0..65535; 0 = off)")
    return port


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a topology file and print a one-line summary."""
    from sfbus.validation import print_notes, validate_topology

    topology = validate_topology(args.topology, getattr(args, "set", None) or ())
    print_notes(topology)
    actors = sum(len(p.actors) * p.replicas for p in topology.processes)
    processes = sum(p.replicas for p in topology.processes)
    print(f"{args.topology}: ok ({processes} processes, {actors} actors, "
          f"{len(topology.connections)} connections)")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    """Print the process / actor / connection graph."""
    from sfbus.topology import render_graph

    print(render_graph(_load(args), args.format))
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    """Remove shared-memory segments left by runs whose launcher died."""
    from sfbus.shm_cleanup import clean_stale_segments

    removed = clean_stale_segments()
    for path in removed:
        print(f"removed {path}")
    print(f"{len(removed)} stale segment(s) removed")
    return 0


def _use_app_dir(app_dir: str) -> None:
    """Put ``app_dir`` first on the import path, here and in every process this one starts (the
    console script, unlike ``python -m``, does not put the working directory there)."""
    path = os.path.abspath(app_dir)
    if path not in sys.path:
        sys.path.insert(0, path)
    inherited = os.environ.get("PYTHONPATH", "")
    if path not in inherited.split(os.pathsep):
        os.environ["PYTHONPATH"] = f"{path}{os.pathsep}{inherited}" if inherited else path


def one_line(text: str) -> str:
    """``text`` on one line: a newline the user typed into an argument shows as ``\\n``."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors: ``error: sfbus run: ...``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print one line naming the command and exit with 2 (bad input)."""
        self.exit(BAD_INPUT, f"error: {self.prog}: {one_line(message)} (see {self.prog} --help)\n")


KERNEL_COMMANDS = ("run", "validate", "graph", "clean")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser, with the kernel's commands and the registered extensions: all of
    them, or only the one whose entry is named ``command`` where there is one."""
    parser = _Parser(prog="sfbus", description="Asynchronous RL on a message bus.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--app-dir", default=".", metavar="DIR",
                        help="import a topology's own modules (components, envs) from DIR as "
                             "well as from installed packages (default: the current directory)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a topology", description=cmd_run.__doc__)
    _topology_args(run, optional=True)
    run.add_argument("--run-dir", help="run directory (default: runs/<topology>-<time>)")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue the run in RUN_DIR with the topology and settings it ran "
                          "with (actors restore their checkpoints; a --set changes what it "
                          "names; the topology file may be left out)")
    run.add_argument("--seed", type=int, default=None, metavar="N",
                     help="the run's seed, as --set seed=N (default: the topology's seed "
                          "setting, else one drawn at random, printed and recorded in the run)")
    run.add_argument("--metrics-port", type=_port, default=None,
                     help="serve Prometheus metrics on 127.0.0.1:PORT (0 = off)")
    run.add_argument("--max-seconds", type=_positive(float), default=None,
                     help="stop after S seconds")
    run.add_argument("--max-frames", type=_positive(int), default=None,
                     help="stop once the actors reported N frames of progress")
    run.add_argument("--serial", action="store_true",
                     help="run every actor on one event loop in this process (debugging)")
    run.set_defaults(func=cmd_run, run_options=tuple(
        entry.load()(run) for entry in entry_points(group="sfbus.run_options")))

    validate = sub.add_parser("validate", help="check a topology file",
                              description=cmd_validate.__doc__)
    _topology_args(validate)
    validate.set_defaults(func=cmd_validate)

    graph = sub.add_parser("graph", help="print the topology graph", description=cmd_graph.__doc__)
    _topology_args(graph)
    graph.add_argument("--format", choices=("mermaid", "dot"), default="mermaid")
    graph.set_defaults(func=cmd_graph)

    clean = sub.add_parser("clean", help="remove stale shared memory",
                           description=cmd_clean.__doc__)
    clean.set_defaults(func=cmd_clean)

    extensions = entry_points(group="sfbus.commands")
    if command in KERNEL_COMMANDS:
        extensions = ()
    elif command in extensions.names:
        extensions = extensions.select(name=command)
    for entry in extensions:
        entry.load()(sub)
    return parser


def command_name(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word after the global options (None: none)."""
    words = iter(argv)
    for word in words:
        if word == "--app-dir":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _topology_args(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    if optional:
        parser.add_argument("topology", nargs="?", help="topology YAML file (not needed with "
                                                        "--resume)")
    else:
        parser.add_argument("topology", help="topology YAML file")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a setting or parameter (repeatable)")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser(command_name(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if not os.path.isdir(args.app_dir):  # a typo would only show later as a missing module
        parser.error(f"argument --app-dir: {args.app_dir}: no such directory")
    _use_app_dir(args.app_dir)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except BadInput as error:
        print(f"error: {one_line(str(error))}", file=sys.stderr)
        return BAD_INPUT
    except SfbusError as error:
        print(f"error: {one_line(str(error))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
