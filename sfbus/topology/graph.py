"""Draw a topology: processes as boxes around their actors, connections as labelled edges."""

from __future__ import annotations

import re
from typing import Literal

from sfbus.topology.model import Topology

GraphFormat = Literal["mermaid", "dot"]


def render_graph(topology: Topology, fmt: GraphFormat = "mermaid") -> str:
    """Render ``topology`` as Mermaid (``flowchart LR``) or Graphviz DOT source text.

    Each process is a subgraph/cluster labelled with its replica count, each actor a node labelled
    with its name and class, each connection an edge labelled ``signal → slot`` (plus ``[any]``
    for ``mode: any``, also drawn dashed). Raises ValueError for an unknown ``fmt``.
    """
    if fmt == "mermaid":
        return _mermaid(topology)
    if fmt == "dot":
        return _dot(topology)
    raise ValueError(f"unknown graph format {fmt!r}; expected 'mermaid' or 'dot'")


def _process_label(name: str, replicas: int) -> str:
    return f"{name} (x{replicas})"


def _edge_label(signal: str, slot: str, mode: str) -> str:
    return f"{signal} → {slot}" + ("" if mode == "broadcast" else f" [{mode}]")


def _mermaid_id(prefix: str, name: str) -> str:
    # Mermaid ids must be plain words; prefixes keep a process and an actor of one name apart.
    return prefix + re.sub(r"\W", "_", name)


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;")


def _mermaid(topology: Topology) -> str:
    lines = ["flowchart LR"]
    for process in topology.processes:
        label = _mermaid_text(_process_label(process.name, process.replicas))
        lines.append(f'    subgraph {_mermaid_id("p_", process.name)}["{label}"]')
        for actor in process.actors:
            text = _mermaid_text(f"{actor.name}<br/>{actor.class_path}")
            lines.append(f'        {_mermaid_id("a_", actor.name)}["{text}"]')
        lines.append("    end")
    for conn in topology.connections:
        arrow = "-.->" if conn.mode == "any" else "-->"
        label = _mermaid_text(_edge_label(conn.signal, conn.slot, conn.mode))
        lines.append(f'    {_mermaid_id("a_", conn.source)} {arrow}|"{label}"| '
                     f'{_mermaid_id("a_", conn.target)}')
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot(topology: Topology) -> str:
    lines = [f"digraph {_dot_text(topology.name)} {{", "    rankdir=LR;",
             "    node [shape=box];"]
    for process in topology.processes:
        # Graphviz draws a subgraph as a box only when its name starts with "cluster".
        lines.append(f"    subgraph {_dot_text('cluster_' + process.name)} {{")
        lines.append(f"        label={_dot_text(_process_label(process.name, process.replicas))};")
        for actor in process.actors:
            label = _dot_text(f"{actor.name}\n{actor.class_path}").replace("\n", "\\n")
            lines.append(f"        {_dot_text(actor.name)} [label={label}];")
        lines.append("    }")
    for conn in topology.connections:
        attrs = f"label={_dot_text(_edge_label(conn.signal, conn.slot, conn.mode))}"
        if conn.mode == "any":
            attrs += ", style=dashed"
        lines.append(f"    {_dot_text(conn.source)} -> {_dot_text(conn.target)} [{attrs}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
