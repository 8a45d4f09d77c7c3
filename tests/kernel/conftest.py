"""Fixtures that host topologies in this process over both transports and always clean up."""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from sfbus.errors import TopologyError
from sfbus.host import ProcessHost
from sfbus.routing import RoutingTable
from sfbus.shm import SharedMemory, new_run_id
from sfbus.topology import load_topology
from sfbus.topology.model import ActorSpec, ConnectionSpec, ProcessSpec, Topology

TRANSPORTS = ("inproc", "ipc")


def make_topology(processes: dict[str, dict[str, str]], connections: list[tuple[str, str, str]],
                  replicas: dict[str, int] | None = None) -> Topology:
    """A topology from ``{process: {actor: class_path}}`` and ``(from, to, mode)`` triples."""
    replicas = replicas or {}
    procs = tuple(
        ProcessSpec(name, tuple(ActorSpec(a, path, None) for a, path in actors.items()),
                    replicas=replicas.get(name, 1))
        for name, actors in processes.items()
    )
    conns = []
    for source, target, mode in connections:
        src, signal = source.split(".")
        dst, slot_name = target.split(".")
        conns.append(ConnectionSpec(src, signal, dst, slot_name, mode))  # type: ignore[arg-type]
    return Topology("test", "<test>", procs, tuple(conns))


@asynccontextmanager
async def hosted(topology: Topology, transport: str = "inproc",
                 run_dir: str | None = None) -> AsyncIterator[dict]:
    """Build and start the topology: one host for all (inproc) or one per process (ipc).

    Yields the actors by instance name; stops every host and removes sockets and memory after.
    """
    table = RoutingTable(topology)
    run_id = new_run_id()
    specs = table.array_specs()
    shm = SharedMemory.create(run_id, specs)
    hosts: list[ProcessHost] = []
    with tempfile.TemporaryDirectory(prefix="sfbus-test-") as sock_dir:
        try:
            groups = [list(table.processes)] if transport == "inproc" else [
                [p] for p in table.processes]
            for group in groups:
                host = ProcessHost(table, group, run_id=run_id, run_dir=run_dir,
                                   sock_dir=None if transport == "inproc" else sock_dir,
                                   array_specs={s.name: s for s in specs},
                                   records=table.records)
                await host.build()
                hosts.append(host)
            for host in hosts:
                await host.start()
            yield {a.name: a for h in hosts for a in h.actors} | {"_hosts": hosts}
        finally:
            for host in hosts:
                await host.stop()
            shm.unlink()


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Run the test over both transports."""
    return request.param


@pytest.fixture
def host_topology() -> Callable:
    """The ``hosted`` context manager."""
    return hosted


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Topology]:
    """Write YAML text to t.yaml in a temp dir and load it, so errors read 't.yaml:L:C: ...'."""
    monkeypatch.chdir(tmp_path)

    def load_text(text: str, overrides: tuple[str, ...] = ()) -> Topology:
        Path("t.yaml").write_text(textwrap.dedent(text), encoding="utf-8")
        return load_topology("t.yaml", overrides)

    return load_text


def error_of(load: Callable[..., Topology], text: str, overrides: tuple[str, ...] = ()) -> str:
    """The message of the TopologyError that loading ``text`` raises."""
    with pytest.raises(TopologyError) as info:
        load(text, overrides)
    return str(info.value)
