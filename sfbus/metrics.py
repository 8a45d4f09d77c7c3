"""Prometheus metrics for every actor of every process, served at one endpoint.

Child processes write their samples with prometheus_client's multiprocess mode into the run's
metrics folder; the supervisor serves them all with ``MultiProcessCollector``. The folder must be
known before prometheus_client is first imported in a process (the library reads it at import),
which is why this module imports it lazily and the launcher sets ``PROMETHEUS_MULTIPROC_DIR`` in
the children's environment.

Names follow ``sfbus_<component>_<quantity>_<unit>``; counters end in ``_total``; labels stay
bounded (``actor``, ``process``, ``policy``).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_metrics: dict[str, Any] = {}


def multiprocess_dir() -> str | None:
    """The folder multiprocess samples go to, or None in a plain single-process run."""
    return os.environ.get(_MULTIPROC_ENV)


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
    """The counter ``name`` (created once per process); ``name`` ends in ``_total``."""
    if not name.endswith("_total"):
        raise ValueError(f"counter {name!r} must end in _total")
    return _get("Counter", name[: -len("_total")], doc, labels)


def gauge(name: str, doc: str, labels: tuple[str, ...] = (), mode: str = "mostrecent") -> Any:
    """The gauge ``name``; ``mode`` says how processes combine (see prometheus_client)."""
    return _get("Gauge", name, doc, labels, multiprocess_mode=mode)


def histogram(name: str, doc: str, labels: tuple[str, ...] = (),
              buckets: tuple[float, ...] | None = None) -> Any:
    """The histogram ``name``."""
    extra = {"buckets": buckets} if buckets else {}
    return _get("Histogram", name, doc, labels, **extra)


def _get(kind: str, name: str, doc: str, labels: tuple[str, ...], **kwargs: Any) -> Any:
    metric = _metrics.get(name)
    if metric is None:
        import prometheus_client

        if multiprocess_dir() is not None:
            _allocate_before_writing()

        if kind != "Gauge":
            kwargs.pop("multiprocess_mode", None)
        metric = getattr(prometheus_client, kind)(name, doc, labels, **kwargs)
        _metrics[name] = metric
    return metric


def _allocate_before_writing() -> None:
    """Give every byte of this process's metric files real blocks before it is written.

    prometheus_client maps its files and grows them sparse (truncate): a write into a page the
    file system cannot allocate (a full disk) kills the process with SIGBUS. Allocated first
    with ``posix_fallocate``, such a write fails as an ``OSError`` where the metric is updated:
    contained, and counted against the actor's failure budget, like any other failure.
    """
    from prometheus_client import mmap_dict

    mmapped = mmap_dict.MmapedDict
    if getattr(mmapped, "_sfbus_allocated", False):
        return
    init, init_value = mmapped.__init__, mmapped._init_value

    def allocated_init(self: Any, filename: str, read_mode: bool = False) -> None:
        if not read_mode:
            fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                size = max(os.fstat(fd).st_size, mmap_dict._INITIAL_MMAP_SIZE)
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        init(self, filename, read_mode)

    def allocated_init_value(self: Any, key: str) -> None:
        # An entry is its length (4 bytes), the key padded to 8 bytes and two doubles.
        if self._used + 4 + len(key.encode()) + 8 + 16 > self._capacity:
            os.posix_fallocate(self._f.fileno(), 0, 2 * self._capacity)
        init_value(self, key)

    mmapped.__init__ = allocated_init
    mmapped._init_value = allocated_init_value
    mmapped._sfbus_allocated = True


def exposition() -> bytes:
    """The text exposition of every process's metrics (or this process's in single mode)."""
    import prometheus_client
    from prometheus_client import multiprocess

    directory = multiprocess_dir()
    if directory is None:
        return prometheus_client.generate_latest()
    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    return prometheus_client.generate_latest(registry)


def serve(host: str, port: int) -> tuple[Any, int]:
    """Serve the exposition over HTTP; returns the server and the bound port (for port 0)."""
    import prometheus_client
    from prometheus_client import multiprocess

    registry: Any = prometheus_client.REGISTRY
    directory = multiprocess_dir()
    if directory is not None:
        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
    server, _thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
    return server, server.server_address[1]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine's loopback only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return host == "localhost"


def process_dead(pid: int) -> None:
    """Drop the live gauges of a process that exited (multiprocess mode only)."""
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


class ActorMetrics:
    """Metrics bound to one actor: ``sfbus_<component>_<quantity>`` labelled ``actor=<name>``."""

    def __init__(self, component: str, actor: str) -> None:
        self.component = component
        self.actor = actor

    def counter(self, quantity: str, doc: str) -> Any:
        """A counter child ``sfbus_<component>_<quantity>_total{actor=...}``."""
        return counter(f"sfbus_{self.component}_{quantity}_total", doc, ("actor",)).labels(
            self.actor)

    def gauge(self, quantity: str, doc: str) -> Any:
        """A gauge child ``sfbus_<component>_<quantity>{actor=...}``."""
        return gauge(f"sfbus_{self.component}_{quantity}", doc, ("actor",)).labels(self.actor)

    def histogram(self, quantity: str, doc: str, buckets: tuple[float, ...] | None = None) -> Any:
        """A histogram child ``sfbus_<component>_<quantity>{actor=...}``."""
        return histogram(f"sfbus_{self.component}_{quantity}", doc, ("actor",), buckets).labels(
            self.actor)

    def counter_family(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
        """A run-wide counter ``name`` with the labels the actor fills (not bound to it)."""
        return counter(name, doc, labels)

    def gauge_family(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
        """A run-wide gauge ``name`` with the labels the actor fills (not bound to it)."""
        return gauge(name, doc, labels)
