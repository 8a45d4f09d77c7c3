"""Fuzzing the topology loader: no input crashes it with anything but TopologyError."""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfbus.errors import TopologyError
from sfbus.topology import load_topology

KEYS = st.sampled_from(["extends", "name", "settings", "run", "processes", "connections",
                        "replicas", "restart", "actors", "class", "params", "from", "to", "mode",
                        "cpu_affinity", "nice", "producer", "consumer", "count"])
SCALARS = (st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False)
           | st.sampled_from(["examples.sum_pipeline:Producer", "producer.item_ready",
                              "consumer.on_item_ready", "always", "any", "x:y", "", "base.yaml"]))
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(KEYS, inner, max_size=4), max_leaves=20)
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(DOCUMENTS)
def test_random_documents_raise_only_topology_error(tmp_path: Path, document: object) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(document))
    with contextlib.suppress(TopologyError):  # any other exception fails the test
        load_topology(path)


@FUZZ
@given(st.text(max_size=200))
def test_random_text_raises_only_topology_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    with contextlib.suppress(TopologyError):
        load_topology(path, [text[:20]] if "=" in text[:20] else [])
