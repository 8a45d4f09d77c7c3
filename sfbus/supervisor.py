"""The launcher and supervisor of a run: one OS process per topology process, watched and restarted.

It creates the run directory (0700), the shared memory and the control socket, starts the
children, waits until every actor started, then watches exits and heartbeats. A crashed or silent
process is restarted by its restart policy until it exceeds ``max_restarts`` within
``restart_window_s``, which fails the run. The first SIGINT/SIGTERM stops gracefully, a second
one kills. Shared memory and socket files are removed on every exit path.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio

from sfbus import metrics
from sfbus.bus import socket_address
from sfbus.child import SUPERVISOR_PID_ENV, child_environment
from sfbus.children import (
    Advances,
    Child,
    apply_report,
    failure_lost_at_stop,
    overdue,
    restarts_counter,
)
from sfbus.errors import FrameError, RunDirError, RunFailed
from sfbus.frames import (
    CONTROL_EDGE,
    SUPERVISOR_SENDER,
    ActorFailed,
    Control,
    Ready,
    Start,
    Stop,
    StopRequested,
    decode_control,
    encode_data,
)
from sfbus.ratelimit import RateLimitedLog
from sfbus.routing import RoutingTable
from sfbus.rundir import (
    ArrayEntry,
    Manifest,
    RunLimits,
    choose_sock_dir,
    make_private_dir,
    remove_sock_dir,
    write_manifest,
    write_snapshot,
)
from sfbus.shm import SharedMemory, new_run_id
from sfbus.shm_cleanup import clean_stale_segments, remove_run_segments
from sfbus.topology.model import Topology

log = logging.getLogger(__name__)


class ExitCode(enum.IntEnum):
    """How a run ended (the CLI's exit status)."""

    FINISHED = 0
    FAILED = 1
    BAD_INPUT = 2
    INTERRUPTED = 130


@dataclass(frozen=True)
class RunOptions:
    """Command-line choices of one run."""

    run_dir: Path
    max_seconds: float | None = None
    max_frames: int | None = None
    metrics_port: int | None = None
    lock_fd: int | None = None
    """The run directory's lock (``RunDirLock``): every process of the run inherits it, so the
    directory stays locked until the last of them has exited, even past a killed launcher."""


class Supervisor:
    """Runs one topology to its end; ``await run()`` returns the exit code."""

    def __init__(self, topology: Topology, document: dict, options: RunOptions) -> None:
        self.topology = topology
        self.document = document
        self.options = options
        self.settings = topology.run
        self.table = RoutingTable(topology)
        self.run_id = new_run_id()
        self.run_dir = options.run_dir.resolve()
        self.children = {name: Child(name) for name in self.table.processes}
        self.outcome: ExitCode | None = None
        self.reason = ""
        self.sock_dir: Path | None = None
        self.lost: list[str] = []
        """What processes could not finish at stop (an ``on_stop`` raised, a process killed at
        its stop timeout or exiting with an error): the run then fails, whatever ended it."""
        self.done = asyncio.Event()
        self._interrupts = 0
        self._advanced: Advances = {}
        self._warn = RateLimitedLog(log)
        self._zmq = zmq.asyncio.Context()

    # ----- the whole run -------------------------------------------------------------------

    async def run(self) -> ExitCode:
        """Start, watch until the run ends, and clean up whatever happened."""
        removed = clean_stale_segments()
        if removed:
            log.info("removed %d shared-memory segments left by dead runs", len(removed))
        shm: SharedMemory | None = None
        ctl = None
        try:
            try:
                specs = self._prepare_run_dir()
            except OSError as error:  # a full disk, a folder replaced: nothing started yet
                raise RunDirError(f"cannot write the run directory {self.run_dir}: "
                                  f"{error.strerror or error}") from None
            shm = SharedMemory.create(self.run_id, specs)
            ctl = self._zmq.socket(zmq.PULL)
            ctl.setsockopt(zmq.LINGER, 0)
            ctl.bind(f"ipc://{self.sock_dir}/supervisor.ipc")
            self._start_metrics_server()
            self._install_signal_handlers()
            receiver = asyncio.ensure_future(self._receive(ctl))
            try:
                await self._start_all()
                await self._watch()
            finally:
                await self._stop_all()
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
            if self.lost:
                self.outcome = ExitCode.FAILED
                self.reason = f"{self.reason}, but work was lost at stop: {'; '.join(self.lost)}"
        except RunFailed as error:
            self._finish(ExitCode.FAILED, str(error))
        finally:
            if ctl is not None:
                ctl.close(linger=0)
            for child in self.children.values():
                if child.control is not None:
                    child.control.close(linger=0)
            if shm is not None:
                shm.close()
                shm.unlink()
            remove_run_segments(self.run_id)
            if self.sock_dir is not None:  # made once the run directory was
                remove_sock_dir(self.sock_dir)
            self._zmq.term()
        assert self.outcome is not None
        level = logging.INFO if self.outcome in (ExitCode.FINISHED,) else logging.ERROR
        log.log(level, "run %s: %s", self.outcome.name.lower(), self.reason)
        return self.outcome

    def _prepare_run_dir(self) -> list:
        make_private_dir(self.run_dir)
        for sub in ("logs", "metrics"):
            make_private_dir(self.run_dir / sub)
        for stale in (self.run_dir / "metrics").glob("*.db"):
            stale.unlink()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.run_dir / "metrics")
        os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())
        self.sock_dir = choose_sock_dir(self.run_dir, self.run_id)
        snapshot = write_snapshot(self.run_dir, self.document)
        specs = self.table.array_specs()
        entries = tuple(ArrayEntry(s.name, tuple(s.shape), s.dtype) for s in specs)
        limits = RunLimits(self.options.max_frames, self.options.max_seconds)
        write_manifest(self.run_dir, Manifest(self.run_id, str(self.sock_dir), snapshot.name,
                                              entries, limits, self.table.records.as_json()))
        return specs

    def _start_metrics_server(self) -> None:
        port = self.options.metrics_port
        if port is None:
            port = self.settings.metrics_port
        if port:
            host = self.settings.metrics_host
            _server, bound = metrics.serve(host, port)
            log.info("metrics at http://%s:%d/metrics", host, bound)
            if not metrics.is_loopback(host):
                log.warning("metrics are served on %s, beyond this machine's loopback: anyone "
                            "who can reach port %d reads them (docs/SECURITY.md)", host, bound)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a closed terminal: HUP
            loop.add_signal_handler(signum, self._on_interrupt, signum)

    def _on_interrupt(self, signum: int) -> None:
        self._interrupts += 1
        if self._interrupts == 1:
            log.warning("%s: stopping gracefully (again to force)", signal.Signals(signum).name)
            self._finish(ExitCode.INTERRUPTED, f"interrupted by {signal.Signals(signum).name}")
        else:
            log.warning("second %s: killing every process", signal.Signals(signum).name)
            alive = [c for c in self.children.values() if c.alive]
            for child in alive:
                child.lost_at_stop = True
                child.kill()
            if alive:
                self.lost.append(f"a second {signal.Signals(signum).name} killed "
                                 f"{', '.join(c.name for c in alive)} before its stop ended")

    def _finish(self, outcome: ExitCode, reason: str) -> None:
        if self.outcome is None:
            self.outcome, self.reason = outcome, reason
        self.done.set()

    # ----- starting and watching -----------------------------------------------------------

    async def _start_all(self) -> None:
        for child in self.children.values():
            await self._spawn(child)
        await self._wait(lambda: all(c.started for c in self.children.values()),
                         self.settings.start_timeout_s, "every process to start")
        if not self.done.is_set():
            log.info("run started: %d processes, run dir %s", len(self.children),
                     self.run_dir)

    async def _spawn(self, child: Child) -> None:
        # The child's restart series exists from its first start: counting a restart later
        # writes a value only, never a new entry that a full disk could refuse.
        restarts_counter().labels(child.name)
        child.ready = child.started = False
        child.progress_base += child.progress
        child.progress = 0
        child.last_heartbeat = child.spawned_at = time.monotonic()
        # Each child leads its own process group, so that the processes it starts (VizDoom's
        # engines) can be killed with it, and so a terminal's Ctrl-C reaches only the supervisor.
        child.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sfbus.child", str(self.run_dir), child.name,
            stdin=subprocess.DEVNULL, start_new_session=True, env=child_environment(),
            pass_fds=() if self.options.lock_fd is None else (self.options.lock_fd,),
        )
        if child.control is None:
            child.control = self._zmq.socket(zmq.PUSH)
            child.control.setsockopt(zmq.LINGER, 0)
            child.control.connect(socket_address(str(self.sock_dir), child.name))
        child.waiter = asyncio.ensure_future(child.proc.wait())
        child.waiter.add_done_callback(lambda task, c=child: self._on_exit(c, task))

    async def _wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.done.is_set():
                return
            if time.monotonic() > deadline:
                raise RunFailed(f"timed out after {timeout:g} s waiting for {what}")
            await asyncio.sleep(0.05)

    async def _watch(self) -> None:
        started = time.monotonic()
        while not self.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), timeout=0.2)
            now = time.monotonic()
            if self.options.max_seconds is not None and now - started >= self.options.max_seconds:
                self._finish(ExitCode.FINISHED,
                             f"reached --max-seconds {self.options.max_seconds:g}")
            if self.options.max_frames is not None and self.progress() >= self.options.max_frames:
                self._finish(ExitCode.FINISHED, f"reached --max-frames {self.options.max_frames}")
            self._check_heartbeats(now)
            self._check_advances(now)

    def progress(self) -> int:
        """Progress reported by every process, restarts included."""
        return sum(c.progress_base + c.progress for c in self.children.values())

    def _check_heartbeats(self, now: float) -> None:
        if not self.done.is_set():
            for child in overdue(self.children, self.settings, now):
                child.kill()

    def _check_advances(self, now: float) -> None:
        """End the run when a kind of progress an actor counts stood still too long."""
        timeout = self.settings.progress_timeout_s
        if not timeout or self.done.is_set():
            return
        for (actor, kind), (count, changed, process) in self._advanced.items():
            if now - changed > timeout:
                activity = self.children[process].activity.get(actor)
                what = (f"; last activity: {activity[1]!r} ({activity[0]:.0f} s before its "
                        f"last heartbeat)" if activity else "")
                self._finish(ExitCode.FAILED,
                             f"no progress: {actor} (process {process}) counted {count:,} {kind} "
                             f"and no more for {timeout:g} s{what}")
                return

    def _on_exit(self, child: Child, task: asyncio.Task[int]) -> None:
        child.kill()
        if self.done.is_set() or task.cancelled():
            return
        code = task.result()
        if child.proc is not None:
            metrics.process_dead(child.proc.pid)
        policy = self.table.processes[child.name].spec.restart
        if policy == "never" or (policy == "on-failure" and code == 0):
            self._finish(ExitCode.FAILED if code else ExitCode.FINISHED,
                         f"process {child.name} exited with code {code}")
            return
        now = time.monotonic()
        child.restarts.append(now)
        while child.restarts and now - child.restarts[0] > self.settings.restart_window_s:
            child.restarts.popleft()
        if len(child.restarts) > self.settings.max_restarts:
            self._finish(ExitCode.FAILED,
                         f"process {child.name} exited with code {code} and was restarted "
                         f"{self.settings.max_restarts} times within "
                         f"{self.settings.restart_window_s:g} s; giving up")
            return
        log.warning("process %s exited with code %s; restarting", child.name, code)
        restarts_counter().labels(child.name).inc()
        task_ = asyncio.ensure_future(self._spawn(child))
        task_.add_done_callback(lambda t: t.exception() and self._finish(
            ExitCode.FAILED, f"could not restart {child.name}: {t.exception()}"))

    # ----- control channel -----------------------------------------------------------------

    async def _receive(self, ctl: zmq.asyncio.Socket) -> None:
        while True:
            frame = await ctl.recv()
            try:
                message = decode_control(frame)
            except FrameError as error:
                self._warn.warning("ctl", "dropped a malformed control frame: %s", error)
                continue
            self._on_control(message)

    def _on_control(self, message: Control) -> None:
        child = self.children.get(getattr(message, "process", ""))
        if child is None:
            self._warn.warning("peer", "control message from unknown process %r", message)
            return
        if isinstance(message, Ready):
            child.ready = True
            self._command(child, Start())
        elif isinstance(message, ActorFailed):
            self._warn.warning(f"failed:{message.actor}:{message.where}", "%s.%s raised: %s",
                               message.actor, message.where, message.error)
            lost = failure_lost_at_stop(child, message)
            if lost:
                self.lost.append(lost)
        elif isinstance(message, StopRequested):
            self._finish(ExitCode.FINISHED,
                         f"{message.actor} asked to stop" + (f": {message.reason}"
                                                             if message.reason else ""))
        else:
            apply_report(child, message, time.monotonic(), self._advanced)

    def _command(self, child: Child, message: Control) -> None:
        if child.control is not None:
            frame = encode_data(SUPERVISOR_SENDER, [(CONTROL_EDGE, message)])
            try:
                child.control.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                log.warning("could not send %s to %s", type(message).__name__, child.name)

    # ----- stopping --------------------------------------------------------------------------

    async def _stop_all(self) -> None:
        running = [c for c in self.children.values() if c.alive]
        for child in running:
            self._command(child, Stop())
        waiters = [c.waiter for c in running if c.waiter is not None]
        if waiters:
            _, pending = await asyncio.wait(waiters, timeout=self.settings.stop_timeout_s)
            killed = [c for c in running if c.alive]
            for child in killed:
                what = (f"process {child.name} did not stop within "
                        f"{self.settings.stop_timeout_s:g} s and was killed"
                        f"{child.last_activity()}")
                log.error("%s", what)
                self.lost.append(what)
                child.kill()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
            await asyncio.sleep(0.05)  # what they said before exiting reaches the receiver
            for child in running:  # an error at stop its actors did not report themselves
                code = child.proc.returncode if child.proc is not None else None
                if child not in killed and code and not child.lost_at_stop:
                    self.lost.append(f"process {child.name} exited with code {code} at stop")
