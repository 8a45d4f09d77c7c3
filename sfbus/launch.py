"""Launching a run: what ``sfbus run`` and :func:`sfbus.run` share, one code path."""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Sequence
from pathlib import Path

from sfbus.errors import BadInput
from sfbus.rundir import RunLimits
from sfbus.topology.model import Topology


def run(topology: str | os.PathLike[str], overrides: Sequence[str] = (), *,
        run_dir: str | os.PathLike[str] | None = None,
        resume: str | os.PathLike[str] | None = None, max_seconds: float | None = None,
        max_frames: int | None = None, metrics_port: int | None = None,
        serial: bool = False) -> int:
    """Validate the topology file ``topology`` with ``--set``-style ``overrides``
    (``"key=value"``) and run it to its end; returns the exit code (0 finished, 1 failed at run
    time, 130 interrupted), as ``sfbus run`` with the same arguments.

    Call it from the main thread, outside any event loop: the run's processes are started from
    here (with ``serial``, every actor runs on one loop in this process instead). They inherit
    this process's environment variables and import path (``sys.path``), so a module the caller
    can import, and what it registered by import path (``components.envs.register_env``), reach
    every one of them. Raises :class:`BadInput` when the topology, an override, a directory or
    a limit is wrong (nothing was started).
    """
    from sfbus.loop import run as run_loop
    from sfbus.routing import RoutingTable
    from sfbus.rundir import RunDirLock, check_run_dir, new_run_dir
    from sfbus.supervisor import RunOptions, Supervisor
    from sfbus.validation import check_shared_memory, read_topology

    _check_limits(max_seconds, max_frames, metrics_port)
    loaded = read_topology(os.fspath(topology), tuple(overrides))
    _check_actors_limits(loaded, RunLimits(max_frames, max_seconds))
    # impossible sizes are bad input: check before starting
    check_shared_memory(RoutingTable(loaded).array_specs(), free=True)
    port = loaded.run.metrics_port if metrics_port is None else metrics_port
    _check_port_free(loaded.run.metrics_host, port)
    if resume:
        if run_dir and Path(run_dir).resolve() != Path(resume).resolve():
            raise BadInput(f"--resume {resume} --run-dir {run_dir}: a resumed run stays in its "
                           "own directory; give one of them")
        _check_same_topology(Path(resume), loaded.name)
    if resume or run_dir:
        directory = Path(resume or run_dir)  # type: ignore[arg-type]
        check_run_dir(directory, resume=bool(resume))
    else:
        rank = _node_rank()
        name = loaded.name if rank is None else f"{loaded.name}-rank{rank}"
        directory = new_run_dir(_file_name(name))
    lock = RunDirLock(directory)  # held until this process exits
    options = RunOptions(run_dir=directory, max_seconds=max_seconds, max_frames=max_frames,
                         metrics_port=port)
    try:
        if serial:
            from sfbus.serial import run_serial

            return int(run_loop(run_serial(loaded, loaded.document, options)))
        return int(run_loop(Supervisor(loaded, loaded.document, options).run()))
    finally:
        lock.release()


def _check_actors_limits(topology: Topology, limits: RunLimits) -> None:
    """An actor whose parameters define ``check_limits(limits)`` may refuse the run's limits
    (a setting that needs ``--max-frames``): bad input before anything starts."""
    for process in topology.processes:
        for actor in process.actors:
            check = getattr(actor.params, "check_limits", None)
            if callable(check):
                try:
                    check(limits)
                except ValueError as error:
                    raise BadInput(f"actor '{actor.name}': {error}") from None


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


def _node_rank() -> int | None:
    """This node's rank when several nodes train together (torchrun's variables, which the
    CLI's ``--nodes`` sets), else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ.get("RANK", "0"))
    return None


def _check_same_topology(run_dir: Path, name: str) -> None:
    """``--resume`` continues a run of the same topology, never another one in its place."""
    from sfbus.topology import load_topology

    snapshot = run_dir / "topology.yaml"
    if not snapshot.is_file():
        return  # not a run: check_run_dir says so
    try:
        resumed = load_topology(snapshot).name
    except BadInput:
        return  # an unreadable snapshot: the actors' own restore reports what they cannot read
    if resumed != name:
        raise BadInput(f"--resume {run_dir}: that directory holds a run of topology "
                       f"{resumed!r}, not {name!r}; resume it with its own topology file")


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
