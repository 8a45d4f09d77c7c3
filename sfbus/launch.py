"""Launching a run: what ``sfbus run`` and :func:`sfbus.run` share, one code path."""

from __future__ import annotations

import math
import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sfbus.errors import BadInput, RunDirError
from sfbus.rundir import RunLimits
from sfbus.topology.model import Topology

if TYPE_CHECKING:
    from sfbus.routing import RoutingTable


def run(topology: str | os.PathLike[str] | None, overrides: Sequence[str] = (), *,
        run_dir: str | os.PathLike[str] | None = None,
        resume: str | os.PathLike[str] | None = None, max_seconds: float | None = None,
        max_frames: int | None = None, metrics_port: int | None = None,
        serial: bool = False, name_suffix: str = "") -> int:
    """Validate the topology file ``topology`` with ``--set``-style ``overrides``
    (``"key=value"``) and run it to its end; returns the exit code (0 finished, 1 failed at run
    time, 130 interrupted), as ``sfbus run`` with the same arguments.

    With ``resume``, the run's own snapshot (its topology and settings as it ran) runs again,
    ``overrides`` changing only what they name (recorded in the run's ``history.jsonl``);
    ``topology`` may then be None, or must be the same topology. A new run's directory is named
    after the topology, with ``name_suffix`` (what a registered run option asks, ``-rank1`` for
    one of several nodes) and the time.

    Call it from the main thread, outside any event loop: the run's processes are started from
    here (with ``serial``, every actor runs on one loop in this process instead). They inherit
    this process's environment variables and import path (``sys.path``), so a module the caller
    can import, and what it registered by import path (``sfbus_components.envs.register_env``),
    reach every one of them. Raises :class:`BadInput` when the topology, an override, a directory or
    a limit is wrong (nothing was started).
    """
    from sfbus.loop import run as run_loop
    from sfbus.rundir import RunDirLock, append_history, check_run_dir, new_run_dir
    from sfbus.seeding import seeded
    from sfbus.supervisor import RunOptions, Supervisor
    from sfbus.validation import check_shared_memory, print_notes, read_topology

    _check_limits(max_seconds, max_frames, metrics_port)
    if STOP_WITH_PARENT_ENV in os.environ:  # a sweep's run: it ends when the sweep dies
        from sfbus.child import stop_when_parent_exits

        stop_when_parent_exits(os.environ[STOP_WITH_PARENT_ENV])
    lock: RunDirLock | None = None  # held until this process exits
    drawn: tuple[str, ...] = ()  # the note on a seed drawn for a new run
    try:
        if resume:
            if run_dir and Path(run_dir).resolve() != Path(resume).resolve():
                raise BadInput(f"--resume {resume} --run-dir {run_dir}: a resumed run stays in "
                               "its own directory; give one of them")
            directory = Path(resume)
            check_run_dir(directory, resume=True)
            lock = RunDirLock(directory)  # a run still using it: refused before it is read
            loaded = read_topology(str(directory / "topology.yaml"), tuple(overrides))
            if topology is not None:
                _check_given_file(directory, os.fspath(topology), tuple(overrides), loaded)
        elif topology is None:
            raise BadInput("sfbus run: give a topology file, or --resume RUN_DIR")
        else:
            loaded, overrides, drawn = seeded(os.fspath(topology), tuple(overrides))
        table = _checked_table(loaded, directory if resume else None, max_frames, max_seconds)
        # impossible sizes are bad input: check before starting
        check_shared_memory(table.array_specs(), free=True)
        port = loaded.run.metrics_port if metrics_port is None else metrics_port
        _check_port_free(loaded.run.metrics_host, port)
        if lock is None:  # a new run: its directory is made only now, all checks passed
            if run_dir:
                directory = Path(run_dir)
                check_run_dir(directory, resume=False)
            else:
                directory = new_run_dir(_file_name(loaded.name + name_suffix))
            lock = RunDirLock(directory)
        try:
            append_history(directory, "resume" if resume else "start", overrides)
        except OSError as error:  # a full disk: refused before anything starts
            raise RunDirError(f"cannot write the run directory {directory}: "
                              f"{error.strerror or error}") from None
        print_notes(loaded, drawn)  # once every check passed: a refusal stays one error line
        options = RunOptions(run_dir=directory, max_seconds=max_seconds, max_frames=max_frames,
                             metrics_port=port, lock_fd=lock.fd)
        if serial:
            from sfbus.serial import run_serial

            return int(run_loop(run_serial(loaded, loaded.document, options)))
        return int(run_loop(Supervisor(loaded, loaded.document, options).run()))
    finally:
        if lock is not None:
            lock.release()


STOP_WITH_PARENT_ENV = "SFBUS_STOP_WITH_PARENT"
"""Environment variable: the pid of the process that started this run (a sweep); the run stops
gracefully when that process dies, however it dies (SIGKILL included)."""


def _checked_table(topology: Topology, resumed: Path | None, max_frames: int | None,
                   max_seconds: float | None) -> RoutingTable:
    """The topology's routing table, once the actors' own checks passed: a resumed run's
    checkpoints against the run records of the settings as resumed, then the run's limits."""
    from sfbus.routing import RoutingTable

    table = RoutingTable(topology)
    if resumed is not None:
        _ask_actors(topology, "check_resume", resumed, table.records,
                    prefix=f"--resume {resumed}: ")
    _ask_actors(topology, "check_limits", RunLimits(max_frames, max_seconds))
    return table


def _ask_actors(topology: Topology, check: str, *arguments: object, prefix: str = "") -> None:
    """Every actor whose parameters define ``check`` (``check_limits(limits)``: a setting that
    needs ``--max-frames``; ``check_resume(run_dir, records)``: a checkpoint of another model
    shape than the run records say) may refuse the run with a ValueError: bad input before
    anything starts."""
    for process in topology.processes:
        for actor in process.actors:
            method = getattr(actor.params, check, None)
            if callable(method):
                try:
                    method(*arguments)
                except ValueError as error:
                    raise BadInput(f"{prefix}actor '{actor.name}': {error}") from None


def _check_limits(max_seconds: float | None, max_frames: int | None,
                  metrics_port: int | None) -> None:
    """The limits the CLI's argument types check, checked for a caller of :func:`run` too."""
    if max_seconds is not None and not 0 < max_seconds < math.inf:
        raise BadInput(f"max_seconds {max_seconds}: must be a finite number > 0")
    if max_frames is not None and (isinstance(max_frames, bool) or not isinstance(
            max_frames, int) or max_frames < 1):
        raise BadInput(f"max_frames {max_frames!r}: must be an integer > 0")
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise BadInput(f"metrics_port {metrics_port}: not a TCP port (0..65535; 0 = off)")


def _check_given_file(run_dir: Path, file: str, overrides: tuple[str, ...],
                      resumed: Topology) -> None:
    """A topology file given with ``--resume`` must be the run's topology; where it differs from
    the run's own settings, say once that it is not used (the run keeps its settings)."""
    from sfbus.validation import read_topology

    given = read_topology(file, overrides)
    if given.name != resumed.name:
        raise BadInput(f"--resume {run_dir}: that directory holds a run of topology "
                       f"{resumed.name!r}, not {given.name!r}; resume it without a file, or "
                       "with its own")
    differ = _differences(resumed.document, given.document)
    if "seed" not in given.settings:  # the seed the run drew at its start (sfbus.seeding)
        differ = [d for d in differ if d != "settings.seed"]
    if differ:
        shown = ", ".join(differ[:5]) + (", ..." if len(differ) > 5 else "")
        print(f"note: --resume {run_dir} runs the run's own topology and settings; {file} "
              f"differs at {shown} and is not used (change a setting with --set KEY=VALUE)",
              file=sys.stderr)


def _differences(a: object, b: object, path: str = "") -> list[str]:
    """The key paths where two documents differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in sorted(a.keys() | b.keys(), key=str)
                for d in _differences(a.get(key), b.get(key), f"{path}.{key}" if path else
                                      str(key))]
    return [] if a == b else [path or "(the whole document)"]


def _file_name(name: str) -> str:
    """``name`` as one file name under ``runs/``: a topology named ``../../x`` or ``a/b`` must
    not put its run directory elsewhere."""
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", name).lstrip(".") or "run"


def _check_port_free(host: str, port: int) -> None:
    """The metrics port must be one this process can bind, checked before anything starts."""
    if not port:
        return
    if not host.strip():  # bind() takes "" as every interface; the metrics server refuses it
        raise BadInput(f"--metrics-port {port}: run.metrics_host is empty; name the address to "
                       "serve on (127.0.0.1: this machine only, 0.0.0.0: every interface)")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # as the metrics server binds it: a port in TIME_WAIT is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise BadInput(f"--metrics-port {port}: cannot serve on {host}:{port}: "
                           f"{error.strerror or error}") from None
