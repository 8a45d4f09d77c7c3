"""Topology.actors_of: a topology's actors found by class, with their replicas' names."""

from __future__ import annotations

from pathlib import Path

import pytest

from sfbus import Actor, TopologyError, import_actor_class, load_topology

KERNEL = Path(__file__).parent
DEMO = KERNEL / "fixtures" / "demo.yaml"


@pytest.fixture(autouse=True)
def _sample_actors_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(KERNEL))  # the fixtures name 'sample_actors:Producer'


def test_actors_are_found_by_class_with_each_replica_in_order() -> None:
    topology = load_topology(DEMO)
    (consumer,) = topology.actors_of(import_actor_class("sample_actors:Consumer"))
    assert consumer.spec.name == "consumer" and consumer.process.name == "consumer"
    assert consumer.instances == ("consumer.0", "consumer.1")  # the process has two replicas
    (producer,) = topology.actors_of("sample_actors:Producer")  # by import path too
    assert producer.instances == ("producer",)
    assert (producer.spec.params.count, producer.spec.params.rate) == (5, 2)


def test_a_base_class_finds_every_subclass_in_the_topologys_order() -> None:
    topology = load_topology(DEMO)
    assert [a.spec.name for a in topology.actors_of(Actor)] == ["producer", "consumer"]
    assert topology.actors_of(Exception) == ()


def test_an_import_path_that_names_no_actor_class_is_refused() -> None:
    with pytest.raises(TopologyError, match="'sample_actors:NotAnActor' is not a subclass"):
        load_topology(DEMO).actors_of("sample_actors:NotAnActor")
