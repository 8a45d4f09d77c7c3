"""Run records: computed once at launch, offered to shared_arrays and to every process's actors."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import ClassVar

import pytest

from sfbus import Actor, ArraySpec, RunRecord, RunRecords, TopologyError
from sfbus.records import record_key
from sfbus.routing import RoutingTable
from sfbus.rundir import Manifest, read_manifest, write_manifest
from sfbus.topology.model import ActorSpec, Location, ProcessSpec, Topology
from tests.kernel.conftest import hosted, make_topology
from tests.kernel.runs import start_run


class Sizes(RunRecord, frozen=True):
    """A record that counts its computations and remembers which process computed it."""

    computed: ClassVar[int] = 0
    processes: int
    launcher: int

    @classmethod
    def from_topology(cls, topology: Topology) -> Sizes:
        """Count the computation; the launcher's pid tells a child's copy from its own."""
        Sizes.computed += 1
        return cls(sum(p.replicas for p in topology.processes), os.getpid())


class Broken(RunRecord, frozen=True):
    """A record the topology cannot determine."""

    @classmethod
    def from_topology(cls, topology: Topology) -> Broken:
        """Refuse, as a record does for a topology it cannot size."""
        raise ValueError("no rollout actor here")


class Sized(Actor):
    """Sizes its array by the record and keeps what its context offers."""

    records = (Sizes,)

    @classmethod
    def shared_arrays(cls, name: str, params: object, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """One array as long as the record says."""
        return [ArraySpec(f"{name}.data", (records[Sizes].processes,), "int64")]

    async def on_start(self) -> None:
        """Read the record in this process."""
        assert self.context is not None
        self.seen = self.context.records[Sizes]


class AlsoSized(Sized):
    """A second class listing the same record: it is still computed once."""


class Unlisted(Actor):
    """Lists no record."""


class BrokenReader(Actor):
    """Lists a record that cannot be computed."""

    records = (Broken,)


def _topology() -> Topology:
    here = __name__
    return make_topology({"a": {"first": f"{here}:Sized"},
                          "b": {"second": f"{here}:AlsoSized", "other": f"{here}:Unlisted"}},
                         [], replicas={"b": 2})


def test_a_record_is_computed_once_and_sizes_shared_arrays() -> None:
    before = Sizes.computed
    table = RoutingTable(_topology())
    specs = {s.name: s.shape for s in table.array_specs()}
    assert specs == {"first.data": (3,), "second.0.data": (3,), "second.1.data": (3,)}
    table.array_specs()
    assert Sizes.computed == before + 1
    assert table.records[Sizes] == Sizes(3, os.getpid())
    assert Broken not in table.records and table.records.get(Broken) is None


async def test_every_process_reads_the_launchers_record(transport: str) -> None:
    async with hosted(_topology(), transport) as actors:
        seen = {name: actors[name].seen for name in ("first", "second.0", "second.1")}
    assert set(seen.values()) == {Sizes(3, os.getpid())}


def test_the_manifest_keeps_records_for_restarted_processes(tmp_path: Path) -> None:
    records = RoutingTable(_topology()).records
    write_manifest(tmp_path, Manifest("id", "", "topology.yaml", (), records=records.as_json()))
    stored = json.loads((tmp_path / "run.json").read_text())["records"]
    assert stored == {record_key(Sizes): {"processes": 3, "launcher": os.getpid()}}
    assert read_manifest(tmp_path).run_records()[Sizes] == records[Sizes]


def test_a_record_that_cannot_be_computed_is_located_at_the_actor_that_lists_it() -> None:
    located = Topology("t", "t.yaml", (ProcessSpec("p", (
        ActorSpec("fine", f"{__name__}:Unlisted", None),
        ActorSpec("reader", f"{__name__}:BrokenReader", None, Location("t.yaml", 4, 7)),
    )),), ())
    with pytest.raises(TopologyError) as caught:
        RoutingTable(located).array_specs()
    assert str(caught.value) == "t.yaml:4:7: actor 'reader': no rollout actor here"


def test_a_record_no_actor_lists_is_a_key_error_naming_it() -> None:
    with pytest.raises(KeyError, match=re.escape(
            "this run has no record tests.kernel.test_records:Sizes: list it in the records of "
            "the actor class that reads it")):
        RunRecords()[Sizes]


class ChildReader(Actor):
    """Writes the record its process sees; the first incarnation then dies to be restarted."""

    records = (Sizes,)

    async def on_start(self) -> None:
        """Keep the record in the run directory, then die (first start) or end the run."""
        assert self.context is not None and self.context.run_dir is not None
        seen = Path(self.context.run_dir, "seen.jsonl")
        with seen.open("a") as out:
            out.write(json.dumps([os.getpid(), self.context.records[Sizes].launcher]) + "\n")
        if len(seen.read_text().splitlines()) == 1:
            self.every(0.2, lambda: os._exit(3))
        else:
            self.stop_run("read the record twice")


@pytest.mark.multiprocess
def test_a_restarted_process_reads_the_record_of_the_launch(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("processes:\n  p:\n    restart: always\n    actors:\n"
                    f"      a: {{class: {__name__}:ChildReader}}\n")
    run = start_run(path, tmp_path / "run")
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err[-3000:]
    seen = [json.loads(line) for line in (tmp_path / "run" / "seen.jsonl").read_text().splitlines()]
    assert len(seen) == 2 and seen[0][0] != seen[1][0]  # two processes
    assert seen[0][1] == seen[1][1] == run.pid  # both read what the launcher computed
