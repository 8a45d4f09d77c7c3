"""Run records: run-wide facts computed once at launch and offered to every actor.

An actor class lists the record types it reads in ``records``; the launcher computes each type
listed anywhere in the topology once (``from_topology``), before any shared array is sized,
writes them as JSON into ``run.json`` and hands them to every actor: to ``shared_arrays`` at
launch and as ``context.records`` in every process. A restarted process reads the same JSON, so
it sees the same record as its first incarnation did (a ``--resume`` launches anew and
computes them again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Self, TypeVar

import msgspec

if TYPE_CHECKING:
    from sfbus.topology.model import Topology

R = TypeVar("R", bound="RunRecord")


class RunRecord(msgspec.Struct, frozen=True):
    """Base of a run record: a frozen msgspec struct a topology determines.

    Subclass it with typed fields (scalars, tuples, dicts, msgspec structs, dataclasses) and
    implement :meth:`from_topology`. Runs in the launcher (and in ``sfbus validate``), once per
    run; a ``ValueError`` it raises is the topology's fault and is reported at the place of the
    first actor that lists the record.
    """

    @classmethod
    def from_topology(cls, topology: Topology) -> Self:
        """Compute the record from the whole topology (every actor's parameters included)."""
        raise NotImplementedError(f"{cls.__qualname__}.from_topology")


def record_key(cls: type[RunRecord]) -> str:
    """The name a record type is stored under in ``run.json``: its import path."""
    return f"{cls.__module__}:{cls.__qualname__}"


class RunRecords:
    """The run's records, by type: ``records[DataPath]``; decoded (validated) on first use."""

    def __init__(self, encoded: Mapping[str, bytes] | None = None) -> None:
        self.encoded: dict[str, bytes] = dict(encoded or {})
        """Each record's JSON by :func:`record_key`, as ``run.json`` holds it."""
        self._decoded: dict[type[RunRecord], RunRecord] = {}

    def __contains__(self, cls: object) -> bool:
        return isinstance(cls, type) and record_key(cls) in self.encoded  # type: ignore[arg-type]

    def __getitem__(self, cls: type[R]) -> R:
        record = self._decoded.get(cls)
        if record is None:
            raw = self.encoded.get(record_key(cls))
            if raw is None:
                raise KeyError(f"this run has no record {record_key(cls)}: list it in the "
                               f"records of the actor class that reads it")
            record = self._decoded[cls] = msgspec.json.decode(raw, type=cls)
        return record  # type: ignore[return-value]

    def get(self, cls: type[R]) -> R | None:
        """The record of type ``cls``, or None when no actor of the run lists it."""
        if cls not in self:
            return None
        return self[cls]

    def as_json(self) -> dict[str, msgspec.Raw]:
        """The records as ``run.json`` embeds them (raw JSON values by key)."""
        return {key: msgspec.Raw(raw) for key, raw in self.encoded.items()}
