"""Serial mode: every actor of a topology on one event loop in this process, no sockets.

For debugging and tests: the same actor code runs as in a full run, with direct calls in place of
ZeroMQ frames. There is no supervision (a crash ends the run).
"""

from __future__ import annotations

import asyncio
import signal
import time

from sfbus.host import ProcessHost
from sfbus.routing import RoutingTable
from sfbus.rundir import RunLimits
from sfbus.shm import SharedMemory, new_run_id
from sfbus.supervisor import ExitCode, RunOptions
from sfbus.topology.model import Topology


async def run_serial(topology: Topology, options: RunOptions) -> ExitCode:
    """Run ``topology`` on this loop until an actor stops it, a limit is hit, or Ctrl-C."""
    table = RoutingTable(topology)
    run_id = new_run_id()
    specs = table.array_specs()
    outcome = ExitCode.FINISHED
    with SharedMemory.create(run_id, specs) as shm:
        try:
            host = ProcessHost(table, table.processes, run_id=run_id, run_dir=str(options.run_dir),
                               array_specs={s.name: s for s in specs},
                               limits=RunLimits(options.max_frames, options.max_seconds))
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
        finally:
            shm.unlink()
    return outcome
