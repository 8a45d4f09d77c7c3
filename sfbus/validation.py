"""Checks of a topology beyond its file: what ``sfbus validate``, ``run`` and ``sweep`` share.

:func:`read_topology` is :func:`sfbus.topology.load_topology` with PyYAML's recursion on deeply
nested values turned into bad input; :func:`validate_topology` adds the sizes of the run's shared
arrays (no machine could hold some sizes a ``--set`` can ask for).
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Sequence

import numpy as np

from sfbus.errors import BadInput
from sfbus.routing import RoutingTable
from sfbus.shm import SHM_DIR, ArraySpec
from sfbus.topology import Topology, load_topology


def read_topology(file: str, overrides: Sequence[str] = ()) -> Topology:
    """Load ``file`` with ``--set`` ``overrides``; a value nested too deeply is bad input."""
    try:
        return load_topology(file, overrides)
    except RecursionError:  # PyYAML composes nodes recursively: [[[[...]]]] a few k deep
        raise BadInput(f"{file}: the topology (or a --set value) is nested too deeply "
                       "to read") from None


def validate_topology(file: str, overrides: Sequence[str] = (), *,
                      free: bool = False) -> Topology:
    """:func:`read_topology`, then refuse shared arrays no file could hold or, with ``free``,
    that this machine's ``/dev/shm`` cannot hold now (raises BadInput)."""
    topology = read_topology(file, overrides)
    check_shared_memory(RoutingTable(topology).array_specs(), free=free)
    return topology


def launch_notes(topology: Topology) -> list[str]:
    """The notes to print once before a run starts (or when it is validated): every distinct one
    that an actor's parameters give through ``launch_notes(topology)``, in the topology's order."""
    notes: dict[str, None] = {}  # actors sharing parameters give the same notes: each once
    for process in topology.processes:
        for actor in process.actors:
            method = getattr(actor.params, "launch_notes", None)
            if callable(method):
                notes.update(dict.fromkeys(method(topology)))
    return list(notes)


def print_notes(topology: Topology, first: Sequence[str] = ()) -> None:
    """Print ``first``, then the topology's :func:`launch_notes`, as ``note:`` lines on stderr."""
    for note in (*first, *launch_notes(topology)):
        print(f"note: {note}", file=sys.stderr)


_MAX_SEGMENT_BYTES = 2**63 - 1  # off_t: no file, hence no segment, can be larger


def check_shared_memory(specs: list[ArraySpec], *, free: bool) -> None:
    """Shared arrays no machine can hold are bad input; with ``free``, so are arrays that this
    machine's ``/dev/shm`` cannot hold now (checked before the run directory is made)."""
    total = 0
    for spec in specs:
        size = math.prod(spec.shape) * np.dtype(spec.dtype).itemsize  # Python ints: no overflow
        if size > _MAX_SEGMENT_BYTES:
            raise BadInput(f"shared array {spec.name!r} of shape {list(spec.shape)} would need "
                           f"{size:.3g} bytes, more than any file can hold; use smaller buffers")
        total += size
    if not free or not specs:
        return
    try:
        available = shutil.disk_usage(SHM_DIR).free
    except OSError:
        return  # no /dev/shm to measure: the run's own creation of the segments says why
    if total > available:
        biggest = max(specs, key=lambda s: math.prod(s.shape) * np.dtype(s.dtype).itemsize)
        raise BadInput(f"the run's shared arrays need {total:,} bytes but {SHM_DIR} has "
                       f"{available:,} free (the largest: {biggest.name!r} of shape "
                       f"{list(biggest.shape)}); use smaller buffers or enlarge {SHM_DIR} "
                       "(docker: --shm-size)")
