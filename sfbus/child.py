"""Entry point of one run process: ``python -m sfbus.child RUN_DIR PROCESS``.

Only the supervisor handles Ctrl-C: a child ignores SIGINT (the terminal sends it to the whole
process group) and stops gracefully on the supervisor's ``Stop`` or on SIGTERM. It asks the
kernel to kill it if the supervisor dies, so no orphan outlives a ``kill -9`` of the launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sfbus.heap import keep_freed_memory
from sfbus.host import ProcessHost
from sfbus.loop import run
from sfbus.routing import RoutingTable
from sfbus.rundir import read_manifest

if TYPE_CHECKING:
    from sfbus.topology.model import SchedulingPolicy

_PR_SET_PDEATHSIG = 1
SUPERVISOR_PID_ENV = "SFBUS_SUPERVISOR_PID"


# Seconds a child whose supervisor died gets to stop gracefully before it is killed.
ORPHAN_GRACE_S = 5.0


def child_environment() -> dict[str, str]:
    """The environment a run's process starts with: the launcher's, with the launcher's import
    path (``sys.path``) in ``PYTHONPATH``, so that a child imports every module the launcher
    can (a module beside the script that called :func:`sfbus.run`, ``--app-dir``, a folder the
    caller put on ``sys.path``)."""
    paths = dict.fromkeys(os.path.abspath(p) for p in sys.path)  # "" is the working directory
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # SIGTERM, not SIGKILL: the child then stops gracefully and closes what it started
        # (VizDoom engine processes would otherwise outlive it).
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: orphans are then cleaned by `sfbus clean`
        pass
    # The supervisor may have died before the line above ran: then nobody will signal us.
    if str(os.getppid()) != os.environ.get(SUPERVISOR_PID_ENV, str(os.getppid())):
        os._exit(1)
    _watch_parent()


def stop_when_parent_exits(parent_pid: str) -> None:
    """SIGTERM this process once when its parent, pid ``parent_pid``, exits, however it exits:
    a graceful stop. (Not the kernel's parent-death signal: it comes again for each thread of
    a parent that has several, and a run takes a second SIGTERM as "force".) Exits at once if
    that parent is gone already."""
    if str(os.getppid()) != parent_pid:
        os._exit(1)
    try:
        parent = os.pidfd_open(int(parent_pid))
    except (AttributeError, OSError, ValueError):  # no pidfd (old kernel, not Linux)
        return

    def watch() -> None:
        select.select([parent], [], [])  # readable once the parent has exited
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _watch_parent() -> None:
    """End this process when the supervisor dies even if its event loop is blocked: SIGTERM is
    handled by that loop, so a thread waits on the parent and, after a grace period, kills this
    process's group (the process and what it started: each child leads its own group)."""
    try:
        parent = os.pidfd_open(os.getppid())
    except (AttributeError, OSError):  # no pidfd (old kernel, not Linux): SIGTERM alone
        return

    def watch() -> None:
        select.select([parent], [], [])  # readable once the parent has exited
        time.sleep(ORPHAN_GRACE_S)
        group = os.getpgid(0)
        if group == os.getpid():
            os.killpg(group, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _configure_logging(run_dir: Path, process: str) -> None:
    fmt = f"%(asctime)s {process} %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt, stream=sys.stderr)
    handler = logging.FileHandler(run_dir / "logs" / f"{process}.log")
    handler.setFormatter(logging.Formatter(fmt))
    logging.getLogger().addHandler(handler)


async def _main(run_dir: Path, process: str) -> list[str]:
    from sfbus.topology import load_topology

    manifest = read_manifest(run_dir)
    topology = load_topology(str(run_dir / manifest.topology_file))
    table = RoutingTable(topology)
    instance = table.processes[process]
    spec = instance.spec
    if spec.cpu_affinity:
        # Replicas are spread one core each (the paper pins every rollout worker to its core);
        # a single process may use every listed core.
        cores = spec.cpu_affinity
        if spec.replicas > 1:
            cores = (cores[instance.replica % len(cores)],)
        os.sched_setaffinity(0, pinned_cores(cores, os.sched_getaffinity(0)))
    if spec.nice:
        apply_nice(spec.nice)
    apply_scheduling(spec.scheduling)
    host = ProcessHost(
        table, [process], run_id=manifest.run_id, run_dir=str(run_dir),
        sock_dir=manifest.sock_dir, array_specs=manifest.array_specs(),
        supervisor_address=f"ipc://{manifest.sock_dir}/supervisor.ipc",
        limits=manifest.limits, records=manifest.run_records(),
    )
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, host.stop_requested.set)
    await host.run()
    return host.lost


def main(argv: list[str] | None = None) -> int:
    """Run one process of a run until the supervisor stops it."""
    run_dir_arg, process = (argv if argv is not None else sys.argv[1:])[:2]
    run_dir = Path(run_dir_arg)
    keep_freed_memory()  # before the first thread allocates, or that thread keeps a heap of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    _configure_logging(run_dir, process)
    try:
        lost = run(_main(run_dir, process))
    except Exception:
        logging.getLogger(__name__).exception("process %s failed", process)
        return 1
    return 1 if lost else 0  # work lost at stop: the run must not look finished


def apply_nice(nice: int) -> None:
    """Run this process at ``nice`` against the run's other processes too. Each leads a session
    of its own, and where Linux schedules sessions as groups (autogroup, on in most
    distributions) a process's own nice orders it only within its session: the group takes it
    as well."""
    os.nice(nice)
    # no autogroup: a kernel without it, or not Linux
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write(str(nice))


def apply_scheduling(policy: SchedulingPolicy) -> None:
    """Run this process, the threads it starts and the processes it starts (a VizDoom engine)
    under Linux's ``policy``; nothing where the system has no SCHED_BATCH.

    Under SCHED_BATCH a woken task waits for the running one to block or use its slice instead
    of preempting it: a rollout process and its engines hand a step back and forth four times
    (one message per tic), and preempted at each wake-up they switched 17 times a sample where
    8 do (doom_benchmark, docs/benchmarks/paper_table.md)."""
    if policy == "batch" and hasattr(os, "SCHED_BATCH"):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def pinned_cores(ids: Sequence[int], allowed: Iterable[int]) -> set[int]:
    """The cores a process's ``cpu_affinity`` ids name: ids count within the cores the run was
    given (all of the machine's, or a launcher's share), wrapping around."""
    usable = sorted(allowed)
    return {usable[i % len(usable)] for i in ids}


if __name__ == "__main__":
    sys.exit(main())
