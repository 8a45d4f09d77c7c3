"""Topology files: YAML wiring of processes, actors and connections, checked before any start."""

from sfbus.topology.classes import import_actor_class
from sfbus.topology.graph import render_graph
from sfbus.topology.loader import load_topology
from sfbus.topology.model import (
    ActorSpec,
    ConnectionSpec,
    Location,
    ProcessSpec,
    RunSettings,
    Topology,
)

__all__ = [
    "ActorSpec",
    "ConnectionSpec",
    "Location",
    "ProcessSpec",
    "RunSettings",
    "Topology",
    "import_actor_class",
    "load_topology",
    "render_graph",
]
