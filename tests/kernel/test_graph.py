"""Graph rendering of a topology in Mermaid and Graphviz DOT."""

from __future__ import annotations

from pathlib import Path

import pytest

from sfbus.topology import Topology, load_topology, render_graph

KERNEL = Path(__file__).parent


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> Topology:
    monkeypatch.syspath_prepend(str(KERNEL))
    return load_topology(KERNEL / "fixtures" / "demo.yaml")


def test_mermaid(demo: Topology) -> None:
    lines = render_graph(demo, "mermaid").splitlines()
    assert lines[0] == "flowchart LR"
    assert '    subgraph p_producer["producer (x1)"]' in lines
    assert '    subgraph p_consumer["consumer (x2)"]' in lines
    assert '        a_producer["producer<br/>sample_actors:Producer"]' in lines
    assert '        a_consumer["consumer<br/>sample_actors:Consumer"]' in lines
    assert '    a_producer -.->|"item_ready → on_item_ready [any]"| a_consumer' in lines
    assert '    a_producer -->|"finished → on_finished"| a_consumer' in lines
    # Every subgraph is closed, and each actor sits inside its process's block.
    assert lines.count("    end") == 2
    assert lines.index('        a_consumer["consumer<br/>sample_actors:Consumer"]') > lines.index(
        '    subgraph p_consumer["consumer (x2)"]')


def test_dot(demo: Topology) -> None:
    text = render_graph(demo, "dot")
    lines = text.splitlines()
    assert lines[0] == 'digraph "demo" {'
    assert lines[-1] == "}"
    assert '    subgraph "cluster_producer" {' in lines
    assert '        label="consumer (x2)";' in lines
    assert '        "producer" [label="producer\\nsample_actors:Producer"];' in lines
    assert ('    "producer" -> "consumer" [label="item_ready → on_item_ready [any]", '
            'style=dashed];') in lines
    assert '    "producer" -> "consumer" [label="finished → on_finished"];' in lines
    assert text.count("{") == text.count("}")


def test_unknown_format(demo: Topology) -> None:
    with pytest.raises(ValueError, match="unknown graph format 'svg'"):
        render_graph(demo, "svg")  # type: ignore[arg-type]
