"""Per-policy templates: processes, actors and connections written out once per policy id."""

from __future__ import annotations

from pathlib import Path

import pytest

from sfbus.routing import RoutingTable
from sfbus.topology import ActorSpec, Topology, load_topology, render_graph
from sfbus.topology.yaml_source import dump_yaml
from tests.kernel.conftest import error_of

KERNEL = Path(__file__).parent

# One producer per policy feeding a shared consumer, and one consumer per policy fed by it.
POPULATION = """\
settings:
  num_policies: 3
  total: 5
processes:
  main:
    actors:
      producer_<policy>:
        class: sample_actors:Producer
        params: {count: <policy>}
      consumer_<policy>: {class: sample_actors:Consumer, params: {tag: run_<policy>}}
      sink: {class: sample_actors:Consumer}
connections:
  - {from: producer_<policy>.item_ready, to: sink.on_item_ready}
  - {from: producer_<policy>.item_ready, to: consumer_<policy>.on_item_ready, mode: any}
"""


@pytest.fixture(autouse=True)
def _sample_actors_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(KERNEL))


def actors_of(topology: Topology) -> dict[str, ActorSpec]:
    return {a.name: a for p in topology.processes for a in p.actors}


def test_actors_and_connections_are_written_out_per_policy(load) -> None:
    topology = load(POPULATION)
    actors = actors_of(topology)
    assert list(actors) == ["producer_0", "producer_1", "producer_2", "consumer_0",
                            "consumer_1", "consumer_2", "sink"]
    assert [actors[f"producer_{i}"].params.count for i in range(3)] == [0, 1, 2]  # an int
    assert [actors[f"consumer_{i}"].params.tag for i in range(3)] == ["run_0", "run_1", "run_2"]
    assert [(a.template, a.index) for a in actors.values()][2:4] == [
        ("producer_<policy>", 2), ("consumer_<policy>", 0)]
    assert (actors["sink"].template, actors["sink"].index) == (None, None)
    assert [(c.source, c.target, c.mode, c.index) for c in topology.connections] == [
        ("producer_0", "sink", "broadcast", 0), ("producer_1", "sink", "broadcast", 1),
        ("producer_2", "sink", "broadcast", 2), ("producer_0", "consumer_0", "any", 0),
        ("producer_1", "consumer_1", "any", 1), ("producer_2", "consumer_2", "any", 2)]
    # every copy keeps its template's place in the file
    assert {c.location.line for c in topology.connections} == {13, 14}
    assert actors["producer_2"].location.line == 7
    # the document stays as written (the run's snapshot), and loads to the same copies again
    assert "producer_<policy>" in topology.document["processes"]["main"]["actors"]
    RoutingTable(topology)


@pytest.mark.parametrize("count", [1, 2, 16])
def test_num_policies_is_a_setting(load, count: int) -> None:
    topology = load(POPULATION, (f"num_policies={count}",))
    assert len(actors_of(topology)) == 2 * count + 1
    assert len(topology.connections) == 2 * count


def test_without_num_policies_there_is_one_policy(load) -> None:
    topology = load(POPULATION.replace("  num_policies: 3\n", ""))
    assert [c.target for c in topology.connections] == ["sink", "consumer_0"]


def test_a_per_policy_process_is_copied_with_its_actors(load) -> None:
    topology = load("""\
        settings: {num_policies: 2, total: 1}
        processes:
          worker_<policy>:
            replicas: 2
            actors:
              producer_<policy>: {class: sample_actors:Producer, params: {count: <policy>}}
          main:
            actors:
              sink: {class: sample_actors:Consumer}
        connections:
          - {from: producer_<policy>.item_ready, to: sink.on_item_ready}
        """)
    assert [(p.name, p.replicas, p.template, p.index) for p in topology.processes] == [
        ("worker_0", 2, "worker_<policy>", 0), ("worker_1", 2, "worker_<policy>", 1),
        ("main", 1, None, None)]
    assert topology.processes[1].actors[0].params.count == 1
    assert sorted(RoutingTable(topology).processes) == [
        "main", "worker_0.0", "worker_0.1", "worker_1.0", "worker_1.1"]
    refined = load(Path("t.yaml").read_text(), ("processes.worker_1.replicas=3",))
    assert [p.replicas for p in refined.processes] == [2, 3, 1]


def test_the_snapshot_keeps_the_templates_and_loads_to_the_same_copies(load) -> None:
    topology = load(POPULATION, ("num_policies=2",))
    Path("snapshot.yaml").write_text(dump_yaml(topology.document))
    again = load_topology("snapshot.yaml")
    assert "producer_<policy>:" in Path("snapshot.yaml").read_text()
    def copies(t: Topology) -> list[tuple[object, ...]]:
        return [(a.name, a.params, a.template, a.index) for a in actors_of(t).values()]

    assert copies(again) == copies(topology)
    assert [(c.source, c.target, c.index) for c in again.connections] == [
        (c.source, c.target, c.index) for c in topology.connections]


def test_an_entry_named_like_a_copy_refines_it(load) -> None:
    text = POPULATION.replace("      sink:", "      producer_1: {params: {rate: 3}}\n      sink:")
    topology = load(text, ("processes.main.actors.producer_2.params.count=9",))
    producers = [actors_of(topology)[f"producer_{i}"].params for i in range(3)]
    assert [(p.count, p.rate) for p in producers] == [(0, 1.0), (1, 3.0), (9, 1.0)]
    assert list(actors_of(topology))[:3] == ["producer_0", "producer_1", "producer_2"]


CONNECTION = "connections:\n  - {from: producer_<policy>.item_ready, to: sink.on_item_ready}\n"
ERRORS = [
    ("no_such_policy",
     POPULATION + "  - {from: producer_0.finished, to: consumer_3.on_finished}\n",
     "t.yaml:15:37: connections[2].to: unknown actor 'consumer_3': policy 3 does not exist: "
     "'consumer_<policy>' has one actor per policy 0..2 (settings.num_policies = 3)"),
    ("unknown_template",
     POPULATION + "  - {from: producer_<policy>.finished, to: consumr_<policy>.on_finished}\n",
     "t.yaml:15:44: connections[2].to: unknown per-policy actor 'consumr_<policy>'; did you mean "
     "'consumer_<policy>'?"),
    ("no_templates",
     "processes:\n  main:\n    actors:\n      producer: {class: sample_actors:Producer}\n"
     "      sink: {class: sample_actors:Consumer, params: {total: 1}}\n" + CONNECTION,
     "t.yaml:7:12: connections[0].from: unknown per-policy actor 'producer_<policy>'; no actor "
     "of this topology is per-policy (named with '<policy>')"),
    ("placeholder_in_member",
     POPULATION + "  - {from: producer_<policy>.finished, to: consumer_<policy>.on_<policy>}\n",
     "t.yaml:15:44: connections[2].to: '<policy>' may stand only in the actor's name, got "
     "'consumer_<policy>.on_<policy>'"),
    ("misspelt_placeholder", POPULATION.replace("consumer_<policy>:", "consumer_<polcy>:"),
     "t.yaml:10:7: processes.main.actors.consumer_<polcy>: unknown placeholder '<polcy>' in "
     "'consumer_<polcy>'; did you mean '<policy>'?"),
    ("misspelt_in_connection",
     POPULATION + "  - {from: producer_<policy>.finished, to: consumer_<polcy>.on_finished}\n",
     "t.yaml:15:44: connections[2].to: unknown placeholder '<polcy>' in "
     "'consumer_<polcy>.on_finished'; did you mean '<policy>'?"),
    ("zero_policies", POPULATION.replace("num_policies: 3", "num_policies: 0"),
     "t.yaml:2:17: settings.num_policies: expected an int in 1..1024 (the number of indices of "
     "<policy>), got int 0"),
    ("bool_policies", POPULATION.replace("num_policies: 3", "num_policies: true"),
     "t.yaml:2:17: settings.num_policies: expected an int in 1..1024 (the number of indices of "
     "<policy>), got bool True"),
    ("plain_actor_in_process_template",
     "settings: {num_policies: 2}\nprocesses:\n  worker_<policy>:\n    actors:\n"
     "      producer: {class: sample_actors:Producer}\n",
     "t.yaml:5:7: processes.worker_<policy>.actors.producer: actor 'producer' of template "
     "process 'worker_<policy>' needs '<policy>' in its name: the process has one copy per "
     "policy, and actor names are unique"),
    ("refines_a_missing_policy",
     POPULATION.replace("      sink:", "      producer_3: {params: {count: 1}}\n      sink:"),
     "t.yaml:11:7: processes.main.actors.producer_3: 'producer_3' refines the copy of "
     "'producer_<policy>' for policy 3, which does not exist (settings.num_policies = 3)"),
    ("two_templates_one_name",
     "settings: {num_policies: 12}\nprocesses:\n  main:\n    actors:\n"
     "      p<policy>1: {class: sample_actors:Producer}\n"
     "      p1<policy>: {class: sample_actors:Producer}\n",
     "t.yaml:6:7: processes.main.actors.p1<policy>: 'p11' would be a copy of both "
     "'p<policy>1' and 'p1<policy>'"),
    ("error_inside_a_copy", POPULATION.replace("count: <policy>}", "count: x<policy>}"),
     "t.yaml:9:25: processes.main.actors.producer_0.params.count: expected int, got str 'x0'"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_errors_are_located_one_liners(load, text: str, expected: str) -> None:
    assert error_of(load, text) == expected


def test_too_many_policies_from_the_command_line(load) -> None:
    assert error_of(load, POPULATION, ("num_policies=100000",)) == (
        "--set: settings.num_policies: expected an int in 1..1024 (the number of indices of "
        "<policy>), got int 100000")


# The same topology over an index set of its own naming: the kernel gives 'policy' no meaning.
SHARDS = "templates: {shard: num_shards}\n" + POPULATION.replace("<policy>", "<shard>").replace(
    "num_policies: 3", "num_shards: 2")


def test_a_topology_names_the_index_set_of_its_templates(load) -> None:
    topology = load(SHARDS)
    actors = actors_of(topology)
    assert list(actors) == ["producer_0", "producer_1", "consumer_0", "consumer_1", "sink"]
    assert (actors["producer_1"].params.count, actors["producer_1"].index) == (1, 1)
    assert [(c.source, c.target, c.index) for c in topology.connections][2:] == [
        ("producer_0", "consumer_0", 0), ("producer_1", "consumer_1", 1)]
    assert "per shard 0..1" in render_graph(topology)
    assert len(actors_of(load(SHARDS, ("num_shards=4",)))) == 9


@pytest.mark.parametrize(("case", "text", "message"), [
    ("the_default_placeholder_is_no_template_there",
     "templates: {shard: num_shards}\n" + POPULATION,
     "t.yaml:8:7: processes.main.actors.producer_<policy>: unknown placeholder '<policy>' in "
     "'producer_<policy>'"),
    ("two_index_sets", SHARDS.replace("{shard: num_shards}", "{shard: num_shards, a: b}"),
     "t.yaml:1:12: templates: expected one index set, {NAME: SETTING} (the placeholder <NAME>, "
     "counted by settings.SETTING), got a mapping"),
    ("a_name_that_is_no_identifier", SHARDS.replace("{shard: num_shards}", "{'a b': n}"),
     "t.yaml:1:13: templates.a b: the index set's name must be an identifier, got str 'a b'"),
    ("a_copy_beyond_the_count", SHARDS.replace("      sink:", "      producer_2: {}\n      sink:"),
     "t.yaml:12:7: processes.main.actors.producer_2: 'producer_2' refines the copy of "
     "'producer_<shard>' for shard 2, which does not exist (settings.num_shards = 2)"),
])
def test_index_set_errors_are_located_one_liners(load, case: str, text: str,
                                                 message: str) -> None:
    assert error_of(load, text) == message
