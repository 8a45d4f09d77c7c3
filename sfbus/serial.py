"""Serial mode: every actor of a topology on one event loop in this process, no sockets.

For debugging and tests: the same actor code runs as in a full run, with direct calls in place of
ZeroMQ frames, in a run directory laid out as a full run's (``topology.yaml``, ``logs/``, what
the actors write). There is no supervision: a crash ends the run.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from sfbus.host import ProcessHost
from sfbus.routing import RoutingTable
from sfbus.rundir import (
    ArrayEntry,
    Manifest,
    RunLimits,
    make_private_dir,
    write_manifest,
    write_snapshot,
)
from sfbus.shm import SharedMemory, new_run_id
from sfbus.supervisor import ExitCode, RunOptions
from sfbus.topology.model import Topology

log = logging.getLogger(__name__)


async def run_serial(topology: Topology, document: dict, options: RunOptions) -> ExitCode:
    """Run ``topology`` on this loop until an actor stops it, a limit is hit, or Ctrl-C."""
    table = RoutingTable(topology)
    run_id = new_run_id()
    specs = table.array_specs()
    make_private_dir(options.run_dir / "logs")
    snapshot = write_snapshot(options.run_dir, document)
    limits = RunLimits(options.max_frames, options.max_seconds)
    entries = tuple(ArrayEntry(s.name, tuple(s.shape), s.dtype) for s in specs)
    # No sockets: the manifest only marks the directory as a run's (for --resume and tools).
    write_manifest(options.run_dir, Manifest(run_id, "", snapshot.name, entries, limits,
                                             table.records.as_json()))
    outcome = ExitCode.FINISHED
    with SharedMemory.create(run_id, specs) as shm:
        try:
            host = ProcessHost(table, table.processes, run_id=run_id, run_dir=str(options.run_dir),
                               array_specs={s.name: s for s in specs},
                               limits=limits, records=table.records)
            interrupted = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, interrupted.set)
            await host.build()
            await host.start()
            started = time.monotonic()
            while not (host.stop_requested.is_set() or interrupted.is_set()):
                await asyncio.sleep(0.05)
                if options.max_seconds and time.monotonic() - started >= options.max_seconds:
                    break
                if options.max_frames and host.progress >= options.max_frames:
                    break
            if interrupted.is_set():
                outcome = ExitCode.INTERRUPTED
            await host.stop()
            if host.lost:
                log.error("run failed: work lost at stop: %s", "; ".join(host.lost))
                outcome = ExitCode.FAILED
        finally:
            shm.unlink()
    return outcome
