"""The supervisor's view of its child processes: their state, and what it reads from them.

A :class:`Child` is one topology process instance as the supervisor (``sfbus/supervisor.py``)
tracks it across restarts; :func:`apply_report` folds a child's control message (``Started``,
``Heartbeat``, ``ActorFailed``) into that state, and :func:`overdue` says which child to kill
for hanging at its start or for falling silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

from sfbus import metrics
from sfbus.frames import ActorFailed, Control, Heartbeat, Started
from sfbus.topology.model import RunSettings

log = logging.getLogger(__name__)


@dataclass
class Child:
    """One process instance of the run, as the supervisor tracks it across restarts."""

    name: str
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    started: bool = False
    last_heartbeat: float = 0.0
    spawned_at: float = 0.0
    activity: dict[str, tuple[float, str]] = field(default_factory=dict)
    progress: int = 0
    progress_base: int = 0
    restarts: deque[float] = field(default_factory=deque)
    lost_at_stop: bool = False
    """An actor of it reported that its ``on_stop`` raised."""
    control: zmq.Socket | None = None
    waiter: asyncio.Task[int] | None = None

    @property
    def alive(self) -> bool:
        """Whether its current process runs."""
        return self.proc is not None and self.proc.returncode is None

    def last_activity(self) -> str:
        """``; last activity: ACTOR 'WHAT'`` for its most recently active actor (or nothing)."""
        last = max(self.activity.items(), key=lambda kv: -kv[1][0], default=None)
        return f"; last activity: {last[0]} {last[1][1]!r}" if last else ""

    def kill(self) -> None:
        """SIGKILL its process group: the child and whatever it started (VizDoom's engines)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)


Advances = dict[tuple[str, str], tuple[int, float, str]]
"""(actor, kind) -> (its count, when it last changed, the actor's process)."""


def apply_report(child: Child, message: Control, now: float, advanced: Advances) -> None:
    """Fold a ``Started`` or ``Heartbeat`` of ``child`` into its state and ``advanced``."""
    if isinstance(message, Started):
        child.started = True
        child.last_heartbeat = now
    elif isinstance(message, Heartbeat):
        child.last_heartbeat = now
        child.progress = message.progress
        child.activity = dict(message.activity)
        for actor, counts in message.advances.items():
            for kind, count in counts.items():
                seen = advanced.get((actor, kind))
                if seen is None or seen[0] != count:  # a restarted actor counts anew
                    advanced[(actor, kind)] = (count, now, child.name)


def failure_lost_at_stop(child: Child, message: ActorFailed) -> str | None:
    """What ``message`` lost if it reports an ``on_stop`` that raised (else None)."""
    if message.where != "on_stop":
        return None
    child.lost_at_stop = True
    return f"{message.actor}.on_stop raised {message.error}"


def overdue(children: dict[str, Child], settings: RunSettings, now: float) -> list[Child]:
    """The children to kill now: hanging in their start, or silent past the heartbeat timeout.

    Each is logged here and marked so that it is named once; its exit restarts it.
    """
    age_gauge = metrics.gauge("sfbus_supervisor_heartbeat_age_seconds",
                              "Seconds since a process last heart-beat", ("process",))
    kill = []
    for child in children.values():
        age = now - child.last_heartbeat
        age_gauge.labels(child.name).set(age)
        if not child.started and child.alive and now - child.spawned_at > settings.start_timeout_s:
            # a restarted process that hangs in on_start (or never reports Ready)
            log.error("process %s did not start within start_timeout_s (%g s); killing it",
                      child.name, settings.start_timeout_s)
            child.spawned_at = float("inf")
            kill.append(child)
        elif child.started and age > settings.heartbeat_timeout_s:
            log.error("process %s stopped heart-beating %.1f s ago%s; killing it",
                      child.name, age, child.last_activity())
            child.started = False
            if child.alive:
                kill.append(child)
    return kill


def restarts_counter() -> Any:
    """The supervisor's counter of process restarts, by process."""
    return metrics.counter("sfbus_supervisor_restarts_total", "Process restarts", ("process",))
