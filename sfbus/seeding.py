"""A new run's seed: the one given, or one drawn at random and recorded with the run.

A topology whose actors take a ``seed`` parameter and that gives no ``seed`` setting gets a seed
drawn here when the run starts; it is added as a ``--set seed=N``, so the run's snapshot
(``topology.yaml``, what ``--resume`` runs again) and ``history.jsonl`` hold it, and the run can be
repeated with ``sfbus run --seed N``. Unseeded runs thus differ from each other, as in Sample
Factory, instead of all repeating one default.
"""

from __future__ import annotations

import dataclasses
import secrets

from sfbus.topology.model import Topology

SEED_BITS = 32
"""Drawn seeds lie in 0 .. 2**32 - 1: what every env takes (VizDoom's, numpy's legacy ones)."""


def seed_to_draw(topology: Topology) -> int | None:
    """A random seed when an actor of ``topology`` has a ``seed`` parameter and no setting gives
    one; None when the topology sets its seed or no actor takes one."""
    if "seed" in topology.settings:
        return None
    takes_seed = any(field.name == "seed" for process in topology.processes
                     for actor in process.actors
                     if dataclasses.is_dataclass(actor.params)
                     for field in dataclasses.fields(actor.params))
    return secrets.randbits(SEED_BITS) if takes_seed else None


def seeded(file: str, overrides: tuple[str, ...]
           ) -> tuple[Topology, tuple[str, ...], tuple[str, ...]]:
    """The new run's topology and overrides, as given or with a seed drawn now added as
    ``seed=N``, and the note that says so (the run is repeated with ``--seed N``)."""
    from sfbus.validation import read_topology

    topology = read_topology(file, overrides)
    seed = seed_to_draw(topology)
    if seed is None:
        return topology, overrides, ()
    overrides = (*overrides, f"seed={seed}")  # in the snapshot and history: --resume keeps it
    note = f"seed {seed} drawn at random (no seed setting); repeat this run with --seed {seed}"
    return read_topology(file, overrides), overrides, (note,)
