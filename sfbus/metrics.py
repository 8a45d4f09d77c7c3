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

        if kind != "Gauge":
            kwargs.pop("multiprocess_mode", None)
        metric = getattr(prometheus_client, kind)(name, doc, labels, **kwargs)
        _metrics[name] = metric
    return metric


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
