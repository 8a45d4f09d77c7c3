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


POPULATION = """\
settings: {num_policies: 3, total: 5}
processes:
  worker_<policy>:
    actors:
      producer_<policy>: {class: sample_actors:Producer, params: {count: <policy>}}
  main:
    actors:
      consumer_<policy>: {class: sample_actors:Consumer}
      sink: {class: sample_actors:Consumer}
connections:
  - {from: producer_<policy>.item_ready, to: consumer_<policy>.on_item_ready, mode: any}
  - {from: producer_<policy>.item_ready, to: sink.on_item_ready}
  - {from: producer_1.finished, to: sink.on_finished}
"""


@pytest.fixture
def population(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Load POPULATION with ``num_policies`` policies."""
    monkeypatch.syspath_prepend(str(KERNEL))
    (tmp_path / "population.yaml").write_text(POPULATION)
    return lambda count: load_topology(tmp_path / "population.yaml", [f"num_policies={count}"])


def test_per_policy_copies_are_drawn_once(population) -> None:
    lines = render_graph(population(3), "mermaid").splitlines()
    assert lines == [
        "flowchart LR",
        '    subgraph p_worker__policy_["worker_#lt;policy#gt; (x1) per policy 0..2"]',
        '        a_producer__policy_["producer_#lt;policy#gt; per policy 0..2<br/>'
        'sample_actors:Producer"]',
        "    end",
        '    subgraph p_main["main (x1)"]',
        '        a_consumer__policy_["consumer_#lt;policy#gt; per policy 0..2<br/>'
        'sample_actors:Consumer"]',
        '        a_sink["sink<br/>sample_actors:Consumer"]',
        "    end",
        '    a_producer__policy_ -.->|"item_ready → on_item_ready [any]"| a_consumer__policy_',
        '    a_producer__policy_ -->|"item_ready → on_item_ready"| a_sink',
        '    a_producer__policy_ -->|"finished → on_finished (policy 1)"| a_sink',
    ]
    dot = render_graph(population(3), "dot").splitlines()
    assert '    subgraph "cluster_worker_<policy>" {' in dot
    assert ('        "producer_<policy>" [label="producer_<policy> per policy 0..2\\n'
            'sample_actors:Producer"];') in dot


def test_the_drawing_does_not_grow_with_the_population(population) -> None:
    assert (render_graph(population(16)).replace("0..15", "0..2")
            == render_graph(population(3)))
