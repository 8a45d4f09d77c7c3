"""The actor base class: signals declared on the class, slots as decorated methods, owned tasks."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import monotonic
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, get_type_hints

from sfbus.errors import ActorDeadError
from sfbus.messages import Empty, Message
from sfbus.metrics import ActorMetrics

if TYPE_CHECKING:
    from sfbus.context import ActorContext
    from sfbus.records import RunRecord, RunRecords
    from sfbus.shm import ArraySpec
    from sfbus.topology.model import Topology

_SLOT_MARK = "__sfbus_slot__"
_FAILURE_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True)
class NoParams:
    """Parameters of an actor that takes none."""


class Signal:
    """A signal declared on an actor class: ``item_ready = Signal(ItemReady)``.

    Read through an instance it gives a :class:`BoundSignal` whose ``emit`` sends the payload to
    every slot the topology connects it to, in this process or another.
    """

    def __init__(self, payload: type[Message] = Empty, doc: str = "") -> None:
        if not (isinstance(payload, type) and issubclass(payload, Message)):
            raise TypeError(f"Signal payload must be a sfbus.Message subclass, got {payload!r}")
        self.payload = payload
        self.doc = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Actor | None, owner: type) -> Any:
        if instance is None:
            return self
        return instance._bound_signals[self.name]


class BoundSignal:
    """A signal of one actor instance; the bus fills in where its emissions go."""

    __slots__ = ("actor", "emitted", "name", "payload", "routes")

    def __init__(self, actor: Actor, signal: Signal) -> None:
        self.name = signal.name
        self.payload = signal.payload
        self.actor = actor
        self.routes: tuple[Callable[[Message, int | None], None], ...] = ()
        self.emitted = 0

    def emit(self, payload: Message | None = None, *, key: int | None = None) -> None:
        """Send ``payload`` to every connected slot; ``key`` picks the replica of an ``any`` link.

        Never blocks: frames for other processes are queued and flushed by the loop (await
        :meth:`Actor.flush` to wait for them). An unconnected signal is a no-op.
        """
        if payload is None:
            payload = Empty()
        elif type(payload) is not self.payload:
            raise TypeError(
                f"{self.actor.name}.{self.name} carries {self.payload.__name__}, "
                f"got {type(payload).__name__}"
            )
        self.emitted += 1
        for route in self.routes:
            route(payload, key)


def slot(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a method as a slot; its one parameter's annotation is the payload type it accepts."""
    setattr(method, _SLOT_MARK, True)
    return method


class Actor:
    """Base class of every component: subclass it, declare signals and slots, wire it in YAML.

    An actor lives on one asyncio loop in one process; its slots and hooks all run on that loop,
    so actor code needs no locks. Sync slots run as soon as a message arrives; ``async`` slots run
    one at a time in arrival order from the actor's mailbox. A slot that raises is logged and
    reported to the supervisor, and the actor keeps running.
    """

    Params: ClassVar[type] = NoParams
    component: ClassVar[str] = ""
    """Metric namespace (``sfbus_<component>_...``); defaults to the class name in lower case."""
    records: ClassVar[tuple[type[RunRecord], ...]] = ()
    """Run records this actor reads (:class:`sfbus.RunRecord` subclasses): the launcher computes
    each once from the topology and offers it to ``shared_arrays`` and ``context.records``."""

    def __init__(self, name: str, params: Any = None, context: ActorContext | None = None) -> None:
        self.name = name
        self.params = params if params is not None else self.Params()
        self.context = context
        self.log = logging.getLogger(f"sfbus.actor.{name}")
        # Kernel bookkeeping is private so that subclasses may use any public attribute name.
        self._received = 0
        self._last_activity = time.monotonic()
        self._last_activity_what = "created"
        self._running = False
        self._stopped = False  # on_stop returned: async slots get nothing more
        self._early: list[tuple[Callable[[Any], Any], Message]] = []
        self._failures_logged: dict[str, float] = {}
        self._failure_times: collections.deque[float] = collections.deque()
        self._advances: dict[str, int] = {}
        self._bound_signals = {
            n: BoundSignal(self, s) for n, s in _class_signals(type(self)).items()}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._mailbox: asyncio.Queue[tuple[Callable[[Any], Awaitable[None]], Message]] | None = None
        self._started = asyncio.Event()
        self._failure_listeners: list[Callable[[Actor, str, BaseException], None]] = []

    # ----- what a subclass overrides -------------------------------------------------------

    async def on_start(self) -> None:
        """Runs on the actor's loop once every process of the run is up; raising fails startup."""

    async def on_stop(self) -> None:
        """Runs on the actor's loop at a graceful stop, before owned tasks are cancelled."""

    def on_failure(self, where: str, error: BaseException) -> None:
        """Called after a slot, timer or owned task raised; the default only logs (already done)."""

    # ----- introspection used by the topology checker -------------------------------------

    @classmethod
    def signal_types(cls) -> dict[str, type[Message]]:
        """The class's signals: name to payload type."""
        return {name: sig.payload for name, sig in _class_signals(cls).items()}

    @classmethod
    def slot_types(cls) -> dict[str, type[Message]]:
        """The class's slots: name to the payload type they accept."""
        slots: dict[str, type[Message]] = {}
        for name in dir(cls):
            method = getattr(cls, name, None)
            if callable(method) and getattr(method, _SLOT_MARK, False):
                slots[name] = _slot_payload_type(cls, name, method)
        return slots

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """Shared-memory arrays the launcher creates for actor instance ``name`` before start.

        Runs in the launcher, once per instance; ``topology`` lets an actor size its buffers by
        the rest of the run (replica counts, other actors' parameters), ``records`` holds the
        run records already computed (those listed in ``records``). Names must be unique in the
        run, so prefix them with ``name``. A ``ValueError`` is the topology's fault, reported at
        the actor's place in the file.
        """
        return []

    # ----- services for subclasses ---------------------------------------------------------

    @property
    def metrics(self) -> ActorMetrics:
        """Prometheus metrics namespaced by this actor's component and labelled with its name."""
        return ActorMetrics(self.component or type(self).__name__.lower(), self.name)

    def spawn(self, coro: Awaitable[Any], what: str = "task") -> asyncio.Task[Any]:
        """Run ``coro`` as a task owned by this actor: cancelled at stop, failures reported."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, what))
        return task

    def every(self, seconds: float, fn: Callable[[], Any], what: str = "") -> asyncio.Task[Any]:
        """Call ``fn`` (sync or async) every ``seconds`` until the actor stops."""
        label = what or f"timer {getattr(fn, '__name__', 'fn')}"

        async def tick() -> None:
            while True:
                await asyncio.sleep(seconds)
                self._touch(label)
                try:
                    result = fn()
                    if inspect.isawaitable(result):
                        await result
                except Exception as error:  # a timer that raises keeps ticking
                    self.report_failure(label, error)

        return self.spawn(tick(), label)

    async def flush(self) -> None:
        """Wait until every frame this process queued for other processes is handed to ZeroMQ."""
        if self.context is not None:
            await self.context.flush()

    def send_now(self) -> None:
        """Send what this process emitted so far now, not when the loop iteration ends.

        A slot's emissions are coalesced with those of every slot the same frame delivers, which
        is what makes floods cheap. A reply that another process waits on should go out before
        this slot's process moves on to slow work: a rollout worker sends a split's request
        before stepping the next split, or the two splits would travel, and wait, together.
        """
        if self.context is not None:
            self.context.send_now()

    def stop_run(self, reason: str = "") -> None:
        """Ask the supervisor to end the whole run gracefully (exit code 0)."""
        if self.context is None:
            raise ActorDeadError(f"actor {self.name!r} is not attached to a run")
        self.context.request_stop(self.name, reason)

    def fail_process(self, reason: str) -> NoReturn:
        """Give up: log ``reason`` and end this actor's process with exit code 1 at once, so the
        supervisor restarts it by its restart policy (or fails the run). For an actor that
        cannot restore its side of a protocol, or keeps failing at it; shared memory survives."""
        self.log.critical("%s: %s; ending process %s", self.name, reason,
                          self.context.process if self.context else "?")
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(1)

    def report_progress(self, frames: int) -> None:
        """Add ``frames`` to the run's progress counter (what ``--max-frames`` counts); they are
        also this actor's advance of kind ``frames``."""
        self.report_advance("frames", frames)
        if self.context is not None:
            self.context.add_progress(frames)

    def report_advance(self, kind: str, amount: int = 1) -> None:
        """Count ``amount`` of this actor's progress of ``kind`` (``"trained batches"``).

        Once an actor has reported a kind (``amount`` 0 declares it, say in ``on_start``), the
        supervisor watches it: a count that stands still for ``run.progress_timeout_s`` ends the
        run with exit 1, naming the actor, the kind and what the actor last did."""
        self._advances[kind] = self._advances.get(kind, 0) + amount

    # ----- kernel plumbing (private) -------------------------------------------------------

    def _bind_slot(self, slot_name: str) -> Callable[[Message], None]:
        """A callable that delivers one payload to the named slot, failures contained."""
        method = getattr(self, slot_name)
        if inspect.iscoroutinefunction(method):
            def enqueue(payload: Message) -> None:
                if self._stopped:  # a peer's late message: no mailbox task runs any more
                    return
                self._received += 1
                self._ensure_mailbox().put_nowait((method, payload))
            return enqueue

        def call(payload: Message) -> None:
            self._received += 1
            if not self._running:  # a peer started first: hold the message until on_start ran
                self._early.append((call_now, payload))
                return
            call_now(payload)

        def call_now(payload: Message) -> None:
            # what the actor is doing, for the heartbeat ("last activity" of a hung actor)
            self._last_activity_what = slot_name
            self._last_activity = monotonic()
            try:
                method(payload)
            except Exception as error:
                self.report_failure(slot_name, error)
        return call

    def _ensure_mailbox(self) -> asyncio.Queue[Any]:
        if self._mailbox is None:
            self._mailbox = asyncio.Queue()
            self.spawn(self._drain_mailbox(), "mailbox")
        return self._mailbox

    async def _drain_mailbox(self) -> None:
        assert self._mailbox is not None
        await self._started.wait()
        while True:
            method, payload = await self._mailbox.get()
            self._touch(method.__name__)
            try:
                await method(payload)
            except Exception as error:
                self.report_failure(method.__name__, error)

    def note(self, what: str) -> None:
        """Say what this actor is doing now: the supervisor names it where it reports the
        actor's process hung, or killed it at its stop timeout (a slot's call or a timer's tick
        replaces it)."""
        self._touch(what)

    def _touch(self, what: str) -> None:
        self._last_activity = monotonic()
        self._last_activity_what = what

    def _task_done(self, task: asyncio.Task[Any], what: str) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.report_failure(what, task.exception())  # type: ignore[arg-type]

    def report_failure(self, where: str, error: BaseException) -> None:
        """Log a failure of this actor's code and tell ``on_failure`` and the supervisor.

        The kernel calls it for slots, timers and owned tasks that raise; call it yourself for
        callbacks you schedule outside those (``loop.call_soon``). Past the run's budget
        (``run.max_actor_failures`` within ``run.actor_failure_window_s``) the actor's process
        ends (exit 1): its restart policy restarts it, or the run fails.
        """
        # The first failure of each place is logged with its traceback; repeats once a minute.
        now = time.monotonic()
        if now - self._failures_logged.get(where, -_FAILURE_LOG_INTERVAL_S) >= \
                _FAILURE_LOG_INTERVAL_S:
            self._failures_logged[where] = now
            self.log.error("%s.%s raised %r", self.name, where, error, exc_info=error)
        try:
            self.on_failure(where, error)
        except Exception:
            self.log.exception("%s.on_failure raised", self.name)
        for listener in self._failure_listeners:
            listener(self, where, error)
        self._count_failure(now, where, error)

    def _count_failure(self, now: float, where: str, error: BaseException) -> None:
        """Past the run's failure budget, end this actor's process: contained failures that go
        on for ever are a fault that never heals."""
        if self.context is None:
            return
        run = self.context.table.topology.run
        times = self._failure_times
        times.append(now)
        while now - times[0] > run.actor_failure_window_s:
            times.popleft()
        if run.max_actor_failures and len(times) > run.max_actor_failures:
            self.fail_process(f"{len(times)} failures within {run.actor_failure_window_s:g} s "
                              f"(run.max_actor_failures {run.max_actor_failures}), the last in "
                              f"{where}: {error!r}")

    async def _start(self) -> None:
        self._touch("on_start")
        await self.on_start()
        self._running = True
        self._started.set()
        early, self._early = self._early, []
        for deliver, payload in early:
            deliver(payload)

    async def _stop(self) -> None:
        if not self._running:
            return
        self._running = False
        try:
            await self.on_stop()
        finally:
            self._stopped = True
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _class_signals(cls: type) -> dict[str, Signal]:
    signals: dict[str, Signal] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Signal):
                signals[name] = value
    return signals


def _slot_payload_type(cls: type, name: str, method: Callable[..., Any]) -> type[Message]:
    params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
    if len(params) != 1:
        raise TypeError(f"slot {cls.__name__}.{name} must take exactly one payload parameter")
    hints = get_type_hints(method)
    payload = hints.get(params[0].name)
    if not (isinstance(payload, type) and issubclass(payload, Message)):
        raise TypeError(
            f"slot {cls.__name__}.{name}: annotate its parameter with a sfbus.Message subclass"
        )
    return payload
