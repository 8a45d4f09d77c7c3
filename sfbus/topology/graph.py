"""Draw a topology: processes as boxes around their actors, connections as labelled edges."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from sfbus.topology.model import Topology

GraphFormat = Literal["mermaid", "dot"]


def render_graph(topology: Topology, fmt: GraphFormat = "mermaid") -> str:
    """Render ``topology`` as Mermaid (``flowchart LR``) or Graphviz DOT source text.

    Each process is a subgraph/cluster labelled with its replica count, each actor a node labelled
    with its name and class, each connection an edge labelled ``signal → slot`` (plus ``[any]``
    for ``mode: any``, also drawn dashed). The copies of a template are drawn once,
    under the template's name with the indices it covers, and so are their connections; a plain
    connection to one copy says which index. Raises ValueError for an unknown ``fmt``.
    """
    if fmt == "mermaid":
        return _mermaid(_drawing(topology))
    if fmt == "dot":
        return _dot(topology.name, _drawing(topology))
    raise ValueError(f"unknown graph format {fmt!r}; expected 'mermaid' or 'dot'")


@dataclass
class _Box:
    """A process as drawn: its name (or template) and label, and its actors' nodes and labels."""

    name: str
    label: str
    nodes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Edge:
    source: str
    target: str
    label: str
    dashed: bool


def _drawing(topology: Topology) -> tuple[list[_Box], list[_Edge]]:
    """Boxes and edges to draw, with every template's copies drawn as one."""
    word = topology.index_name
    indices: dict[str, list[int]] = {}  # template -> indices of its copies
    node_of: dict[str, str] = {}  # actor name -> the node it is drawn as
    index_of: dict[str, int] = {}  # a copy's name -> its index
    for process in topology.processes:
        for actor in process.actors:
            node_of[actor.name] = actor.template or actor.name
            if actor.template is not None and actor.index is not None:
                indices.setdefault(actor.template, []).append(actor.index)
                index_of[actor.name] = actor.index
    boxes: dict[str, _Box] = {}
    for process in topology.processes:
        name = process.template or process.name
        label = f"{name} (x{process.replicas})"
        if process.template is not None:
            label += f" {_per_index(word, indices, process.actors[0].template)}"
        box = boxes.setdefault(name, _Box(name, label))
        for actor in process.actors:
            node = node_of[actor.name]
            text = node if actor.template is None else f"{node} {_per_index(word, indices, node)}"
            box.nodes[node] = f"{text}\n{actor.class_path}"
    edges: dict[_Edge, None] = {}  # ordered and without the copies' repeats
    for conn in topology.connections:
        label = f"{conn.signal} → {conn.slot}" + (
            "" if conn.mode == "broadcast" else f" [{conn.mode}]")
        copies = [index_of[a] for a in (conn.source, conn.target) if a in index_of]
        if conn.index is None and copies:  # a plain connection to one copy of a template
            label += f" ({word} {copies[0]})"
        edges[_Edge(node_of[conn.source], node_of[conn.target], label, conn.mode == "any")] = None
    return list(boxes.values()), list(edges)


def _per_index(word: str, indices: dict[str, list[int]], template: str | None) -> str:
    ids = sorted(indices[template or ""])  # a copy's template always has copies
    return f"per {word} {ids[0]}..{ids[-1]}"


def _mermaid_id(prefix: str, name: str) -> str:
    # Mermaid ids must be plain words; prefixes keep a process and an actor of one name apart.
    return prefix + re.sub(r"\W", "_", name)


def _mermaid_text(text: str) -> str:
    # Labels are HTML to Mermaid: a placeholder ('<policy>') would be read as a tag and vanish.
    return (text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
            .replace("\n", "<br/>"))


def _mermaid(drawing: tuple[list[_Box], list[_Edge]]) -> str:
    boxes, edges = drawing
    lines = ["flowchart LR"]
    for box in boxes:
        lines.append(f'    subgraph {_mermaid_id("p_", box.name)}["{_mermaid_text(box.label)}"]')
        for node, label in box.nodes.items():
            lines.append(f'        {_mermaid_id("a_", node)}["{_mermaid_text(label)}"]')
        lines.append("    end")
    for edge in edges:
        arrow = "-.->" if edge.dashed else "-->"
        lines.append(f'    {_mermaid_id("a_", edge.source)} {arrow}|"{_mermaid_text(edge.label)}"| '
                     f'{_mermaid_id("a_", edge.target)}')
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot(name: str, drawing: tuple[list[_Box], list[_Edge]]) -> str:
    boxes, edges = drawing
    lines = [f"digraph {_dot_text(name)} {{", "    rankdir=LR;", "    node [shape=box];"]
    for box in boxes:
        # Graphviz draws a subgraph as a box only when its name starts with "cluster".
        lines.append(f"    subgraph {_dot_text('cluster_' + box.name)} {{")
        lines.append(f"        label={_dot_text(box.label)};")
        for node, label in box.nodes.items():
            lines.append(f"        {_dot_text(node)} [label={_dot_text(label)}];")
        lines.append("    }")
    for edge in edges:
        attrs = f"label={_dot_text(edge.label)}" + (", style=dashed" if edge.dashed else "")
        lines.append(f"    {_dot_text(edge.source)} -> {_dot_text(edge.target)} [{attrs}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
