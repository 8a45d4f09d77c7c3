"""Topology loading: extends, --set, parameter typing and every located error, verbatim."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Annotated

import pytest

from sfbus import Interval, Range
from sfbus.errors import TopologyError
from sfbus.topology import Location, RunSettings, load_topology
from sfbus.topology.params import ParamError, convert
from tests.kernel.conftest import error_of

KERNEL = Path(__file__).parent


@pytest.fixture(autouse=True)
def _sample_actors_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # Topologies name 'sample_actors:Producer'; make that import work from any rootdir layout.
    monkeypatch.syspath_prepend(str(KERNEL))


@pytest.fixture
def in_kernel_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from tests/kernel so fixture paths (and error messages) are 'fixtures/x.yaml'."""
    monkeypatch.chdir(KERNEL)


GOOD = """\
settings:
  total: 3
processes:
  main:
    actors:
      producer:
        class: sample_actors:Producer
      consumer:
        class: sample_actors:Consumer
connections:
  - from: producer.item_ready
    to: consumer.on_item_ready
"""


# ----- the good path -------------------------------------------------------------------------


def test_extends_merges_deeply_and_resolves_params(in_kernel_dir: None) -> None:
    topo = load_topology("fixtures/demo.yaml")
    assert topo.name == "demo"  # the name is not inherited from base.yaml
    assert topo.path == "fixtures/demo.yaml"
    producer_proc, consumer_proc = topo.processes
    assert (producer_proc.name, producer_proc.replicas, producer_proc.restart) == (
        "producer", 1, "on-failure")
    assert producer_proc.cpu_affinity == (0, 1)
    assert (consumer_proc.replicas, consumer_proc.restart) == (2, "always")
    producer = producer_proc.actors[0]
    assert producer.class_path == "sample_actors:Producer"
    assert (producer.params.count, producer.params.rate) == (5, 2.0)  # count from base
    assert isinstance(producer.params.rate, float)  # an int is accepted for a float
    consumer = consumer_proc.actors[0].params
    assert (consumer.total, consumer.lr, consumer.sampling) == (100, 0.001, "batched")
    assert consumer.layers == (32, 32)
    assert topo.run == RunSettings(heartbeat_timeout_s=20.0)
    assert [(c.signal, c.slot, c.mode) for c in topo.connections] == [
        ("item_ready", "on_item_ready", "any"), ("finished", "on_finished", "broadcast")]
    assert topo.connections[0].location == Location("fixtures/demo.yaml", 12, 5)
    assert consumer_proc.actors[0].location == Location("fixtures/base.yaml", 19, 7)
    assert "extends" not in topo.document


def test_params_of_every_supported_type(load) -> None:
    topo = load(GOOD.replace("class: sample_actors:Consumer", textwrap.dedent("""\
        class: sample_actors:Consumer
                params:
                  sampling: batched
                  lr: 1e-3
                  tag: null
                  layers: [8, 16, 8]
                  names: [a, b]
                  weights: {x: 1, y: 0.5}
                  network: {hidden: 128, activation: tanh}""")))
    params = topo.processes[0].actors[1].params
    assert params.lr == 0.001  # YAML 1.1 would read '1e-3' as a string
    assert params.tag is None
    assert params.layers == (8, 16, 8)
    assert params.names == ["a", "b"]
    assert params.weights == {"x": 1.0, "y": 0.5}
    assert (params.network.hidden, params.network.activation) == (128, "tanh")


def test_defaults(load) -> None:
    topo = load(GOOD)
    assert topo.name == "t"
    assert topo.processes[0].actors[0].params.count == 10
    assert topo.settings == {"total": 3}
    assert topo.run == RunSettings()


def test_a_setting_no_actor_reads_is_an_error_with_a_suggestion(load) -> None:
    text = GOOD.replace("total: 3", "total: 3\n  cont: 5")
    assert error_of(load, text) == ("t.yaml:3:3: settings.cont: unknown setting 'cont': no actor "
                                    "of this topology has such a parameter; did you mean 'count'?")
    assert error_of(load, GOOD, ("totl=4",)) == (
        "--set: settings.totl: unknown setting 'totl': no actor of this topology has such a "
        "parameter; did you mean 'total'?")


def test_a_setting_named_after_an_actor_points_at_the_actor_parameter_path(load) -> None:
    # '--set consumer.total=1' lands in settings.consumer, which no actor reads
    assert error_of(load, GOOD, ("consumer.total=1",)) == (
        "--set: settings.consumer: unknown setting 'consumer': no actor of this topology has such "
        "a parameter; an actor's own parameter is set by its path, "
        "processes.main.actors.consumer.params.<name>")


@pytest.mark.parametrize(("override", "message"), [
    ("run.heartbeat_interval_s=0", "expected a number in 0.01..1e+07, got float 0.0"),
    ("run.stop_timeout_s=-1", "expected a number in 0..1e+07, got float -1.0"),
    ("run.stop_timeout_s=0", "stop_timeout_s must be a finite number > 0, got 0.0"),
    ("run.start_timeout_s=.nan", "expected a finite float, got float nan"),
    # finite but past any run: the waits that take it would overflow (a thread's near 9e9 s)
    ("run.stop_timeout_s=1e300", "expected a number in 0..1e+07, got float 1e+300"),
    ("run.progress_timeout_s=1e10", "expected a number in 0..1e+07, got float 10000000000.0"),
    ("run.max_restarts=-1", "max_restarts must be >= 0, got -1"),
    ("run.heartbeat_timeout_s=0.5",
     "heartbeat_timeout_s must be > heartbeat_interval_s (1), got 0.5"),
    ("run.metrics_port=70000", "metrics_port must be a TCP port in 0..65535 (0: off), got 70000"),
])
def test_run_settings_out_of_range_are_located_errors(load, override: str, message: str) -> None:
    key = override.split("=")[0]
    assert error_of(load, GOOD, (override,)) == f"--set: {key}: {message}"


def test_a_string_that_looks_like_a_float_survives_the_snapshot_round_trip(load) -> None:
    from sfbus.rundir import write_snapshot

    # Children load the run's snapshot of the merged document: '1e3' must stay a string there.
    topo = load(GOOD.replace("total: 3", "total: 3\n  tag: '1e3'"))
    assert topo.processes[0].actors[1].params.tag == "1e3"
    snapshot = write_snapshot(Path("."), {**topo.document, "name": "t"})
    again = load_topology(snapshot)
    assert again.processes[0].actors[1].params.tag == "1e3"
    assert again.document == {**topo.document, "name": "t"}


def test_an_alias_bomb_is_refused_quickly(load) -> None:
    import time

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    started = time.monotonic()
    message = error_of(load, "\n".join(lines) + "\n")
    assert "expands to more than 100000 values (nested aliases?)" in message
    assert time.monotonic() - started < 10  # 10^9 values if expanded
    levels = ["&l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    with pytest.raises(TopologyError, match="expands to more than 100000 values"):
        load(GOOD, (f"total=[{', '.join(levels)}]",))


def test_yaml_merge_keys_and_anchors(load) -> None:
    topo = load("""\
        processes:
          main:
            actors:
              a: &producer
                class: sample_actors:Producer
                params: {count: 1}
              b:
                <<: *producer
                params: {count: 2}
        """)
    assert [a.params.count for a in topo.processes[0].actors] == [1, 2]


# ----- --set ---------------------------------------------------------------------------------


def test_set_shorthand_goes_to_settings(load) -> None:
    topo = load(GOOD, ("total=7", "sampling=batched", "lr=1e-3"))
    params = topo.processes[0].actors[1].params
    assert (params.total, params.sampling, params.lr) == (7, "batched", 0.001)
    assert topo.settings["total"] == 7


def test_set_full_paths(load) -> None:
    topo = load(GOOD, ("processes.main.actors.producer.params.count=3",
                       "processes.main.replicas=4", "run.max_restarts=9", "name=renamed",
                       "processes.main.cpu_affinity=[2, 3]"))
    assert topo.name == "renamed"
    assert topo.processes[0].replicas == 4
    assert topo.processes[0].cpu_affinity == (2, 3)
    assert topo.processes[0].actors[0].params.count == 3
    assert topo.run.max_restarts == 9


def test_auto_replicas_and_affinity_follow_the_machines_cores(load) -> None:
    topo = load(GOOD, ("processes.main.replicas=auto", "processes.main.cpu_affinity=auto"))
    cores = len(os.sched_getaffinity(0))
    assert topo.processes[0].replicas == cores
    assert topo.processes[0].cpu_affinity == tuple(range(cores))


def test_set_params_win_over_settings(load) -> None:
    topo = load(GOOD, ("processes.main.actors.consumer.params.total=5", "total=6"))
    assert topo.processes[0].actors[1].params.total == 5


@pytest.mark.parametrize(("override", "expected"), [
    ("total=abc", "--set: settings.total: expected int, got str 'abc' "
                  "(parameter 'total' of actor 'consumer')"),
    ("processes.main.replicas=zero", "--set: processes.main.replicas: expected int, got str "
                                     "'zero'"),
    ("processes.main.actors.producer.params.cont=3",
     "--set: processes.main.actors.producer.params.cont: unknown parameter 'cont' of "
     "sample_actors:Producer; did you mean 'count'?"),
    ("processes.main.actors.producer.params.rate=fast",
     "--set: processes.main.actors.producer.params.rate: expected float, got str 'fast'"),
    ("connections.0.mode=any", "--set: connections: cannot set a key inside a list, only inside "
                               "a mapping"),
    ("processes.main.actors.producer.class.x=1", "--set: processes.main.actors.producer.class: "
                                                 "cannot set a key inside str, only inside a "
                                                 "mapping"),
    ("no_equals_sign", "--set: expected KEY=VALUE, got 'no_equals_sign'"),
    ("a..b=1", "--set: a..b: empty key in path"),
    ("extends=other.yaml", "--set: extends: cannot be overridden; edit the file instead"),
    ("total=[1, 2", "--set: total: invalid value '[1, 2': invalid YAML: while parsing a flow "
                    "sequence, expected ',' or ']', but got '<stream end>'"),
    ("processes.extra.replicas=2", "--set: processes.extra: missing required key 'actors'"),
])
def test_set_errors(load, override: str, expected: str) -> None:
    assert error_of(load, GOOD, (override,)) == expected


# ----- located errors ------------------------------------------------------------------------


def test_unknown_signal_in_fixture(in_kernel_dir: None) -> None:
    with pytest.raises(TopologyError) as info:
        load_topology("fixtures/bad_signal.yaml")
    assert str(info.value) == ("fixtures/bad_signal.yaml:3:11: connections[0].from: unknown signal "
                               "'item_redy' of actor 'producer'; did you mean 'item_ready'?")
    assert (info.value.file, info.value.line, info.value.column) == (
        "fixtures/bad_signal.yaml", 3, 11)
    assert info.value.key == "connections[0].from"


@pytest.mark.parametrize(("name", "expected"), [
    ("missing_base", "fixtures/missing_base.yaml:1:10: extends: file not found: "
                     "'fixtures/nowhere.yaml'"),
    ("cycle_a", "fixtures/cycle_b.yaml:1:10: extends: extends cycle: fixtures/cycle_a.yaml -> "
                "fixtures/cycle_b.yaml -> fixtures/cycle_a.yaml"),
    ("no_such_file", "fixtures/no_such_file.yaml: file not found"),
])
def test_file_errors(in_kernel_dir: None, name: str, expected: str) -> None:
    with pytest.raises(TopologyError) as info:
        load_topology(f"fixtures/{name}.yaml")
    assert str(info.value) == expected


def _case(text: str) -> str:
    return textwrap.dedent(text)


# Each case: (id, YAML, expected one-line error). Cases edit GOOD so their lines stay readable.
ERRORS = [
    ("syntax", "processes:\n  main: [1, 2\n",
     "t.yaml:3:1: invalid YAML: while parsing a flow sequence, expected ',' or ']', but got "
     "'<stream end>'"),
    ("tab", "processes:\n\tmain: {}\n",
     "t.yaml:2:1: invalid YAML: while scanning for the next token, found character '\\t' "
     "that cannot start any token"),
    ("two_documents", "name: a\n---\nname: b\n",
     "t.yaml:2:1: invalid YAML: expected a single document in the stream, but found another "
     "document"),
    ("empty", "# nothing\n", "t.yaml: the file is empty; a topology must be a mapping"),
    ("list_document", "- a\n- b\n", "t.yaml:1:1: a topology must be a mapping, got a list"),
    ("duplicate_key", GOOD + "settings: {}\n",
     "t.yaml:13:1: settings: duplicate key 'settings' (first defined on line 1)"),
    ("non_string_key", "settings:\n  1: a\n",
     "t.yaml:2:3: settings: keys must be strings, got int 1"),
    ("unknown_top_key", GOOD + "conections: []\n",
     "t.yaml:13:1: conections: unknown key 'conections'; did you mean 'connections'?"),
    ("no_processes", "settings: {}\n", "t.yaml:1:1: processes: a topology needs at least one "
                                       "process"),
    ("processes_list", "processes: [a]\n",
     "t.yaml:1:12: processes: expected a mapping, got a list"),
    ("unknown_process_key", GOOD.replace("  main:\n", "  main:\n    replica: 2\n"),
     "t.yaml:5:5: processes.main.replica: unknown key 'replica'; did you mean 'replicas'?"),
    ("replicas_zero", GOOD.replace("  main:\n", "  main:\n    replicas: 0\n"),
     "t.yaml:5:15: processes.main.replicas: expected an int in 1..1024, got 0"),
    ("replicas_bool", GOOD.replace("  main:\n", "  main:\n    replicas: yes\n"),
     "t.yaml:5:15: processes.main.replicas: expected int, got bool True"),
    ("restart_typo", GOOD.replace("  main:\n", "  main:\n    restart: on_failure\n"),
     "t.yaml:5:14: processes.main.restart: expected one of 'always', 'on-failure', 'never', "
     "got str 'on_failure'; did you mean 'on-failure'?"),
    ("affinity_type", GOOD.replace("  main:\n", "  main:\n    cpu_affinity: [0, x]\n"),
     "t.yaml:5:23: processes.main.cpu_affinity[1]: expected int, got str 'x'"),
    ("nice_range", GOOD.replace("  main:\n", "  main:\n    nice: 30\n"),
     "t.yaml:5:11: processes.main.nice: expected an int in -20..19, got 30"),
    ("scheduling_typo", GOOD.replace("  main:\n", "  main:\n    scheduling: batched\n"),
     "t.yaml:5:17: processes.main.scheduling: expected 'normal' or 'batch', got str "
     "'batched'; did you mean 'batch'?"),
    ("bad_process_name", GOOD.replace("  main:\n", "  main.0:\n"),
     "t.yaml:4:3: processes.main.0: invalid process name 'main.0': use letters, digits, '_' "
     "and '-', starting with a letter or '_'"),
    ("no_actors_key", "processes:\n  main:\n    replicas: 2\n",
     "t.yaml:3:5: processes.main: missing required key 'actors'"),
    ("empty_actors", "processes:\n  main:\n    actors: {}\n",
     "t.yaml:3:13: processes.main.actors: process 'main' has no actors"),
    ("unknown_actor_key", GOOD.replace("        class: sample_actors:Producer\n",
                                       "        class: sample_actors:Producer\n"
                                       "        parms: {}\n"),
     "t.yaml:8:9: processes.main.actors.producer.parms: unknown key 'parms'; "
     "did you mean 'params'?"),
    ("missing_class", "processes:\n  main:\n    actors:\n      a:\n        params: {}\n",
     "t.yaml:5:9: processes.main.actors.a: missing required key 'class'"),
    ("class_format", GOOD.replace("sample_actors:Producer", "sample_actors.Producer"),
     "t.yaml:7:16: processes.main.actors.producer.class: expected 'package.module:Name', "
     "got 'sample_actors.Producer'"),
    ("no_module", GOOD.replace("sample_actors:Producer", "sample_actorz:Producer"),
     "t.yaml:7:16: processes.main.actors.producer.class: cannot import module 'sample_actorz': "
     "no module named 'sample_actorz' (not installed, nor on PYTHONPATH or in the working "
     "directory)"),
    ("no_submodule", GOOD.replace("sample_actors:Producer", "sfbus.actr:Producer"),
     "t.yaml:7:16: processes.main.actors.producer.class: cannot import module 'sfbus.actr': "
     "no module named 'sfbus.actr'; did you mean 'actor'?"),
    ("no_attribute", GOOD.replace("sample_actors:Producer", "sample_actors:Prodcer"),
     "t.yaml:7:16: processes.main.actors.producer.class: module 'sample_actors' has no "
     "attribute 'Prodcer'; did you mean 'Producer'?"),
    ("not_an_actor", GOOD.replace("sample_actors:Producer", "sample_actors:NotAnActor"),
     "t.yaml:7:16: processes.main.actors.producer.class: 'sample_actors:NotAnActor' is not a "
     "subclass of sfbus.actor.Actor"),
    ("duplicate_actor", GOOD.replace("connections:", "  other:\n    actors:\n      producer:\n"
                                                     "        class: sample_actors:Producer\n"
                                                     "connections:"),
     "t.yaml:12:7: processes.other.actors.producer: duplicate actor name 'producer' "
     "(also in process 'main')"),
    ("unknown_param", GOOD.replace("        class: sample_actors:Producer\n",
                                   "        class: sample_actors:Producer\n"
                                   "        params: {cont: 3}\n"),
     "t.yaml:8:18: processes.main.actors.producer.params.cont: unknown parameter 'cont' of "
     "sample_actors:Producer; did you mean 'count'?"),
    ("param_type", GOOD.replace("        class: sample_actors:Producer\n",
                                "        class: sample_actors:Producer\n"
                                "        params: {count: '3'}\n"),
     "t.yaml:8:25: processes.main.actors.producer.params.count: expected int, got str '3'"),
    ("params_not_mapping", GOOD.replace("        class: sample_actors:Producer\n",
                                        "        class: sample_actors:Producer\n"
                                        "        params: [1]\n"),
     "t.yaml:8:17: processes.main.actors.producer.params: expected a mapping, got a list"),
    ("missing_required_param", GOOD.replace("settings:\n  total: 3\n", ""),
     "t.yaml:6:7: processes.main.actors.consumer: missing required parameter 'total' "
     "(int) of sample_actors:Consumer"),
    ("settings_type", GOOD.replace("total: 3", "total: 3.5"),
     "t.yaml:2:10: settings.total: expected int, got float 3.5 "
     "(parameter 'total' of actor 'consumer')"),
    ("literal_param", GOOD.replace("total: 3", "total: 3\n  sampling: batchd"),
     "t.yaml:3:13: settings.sampling: expected 'plain' or 'batched', got str 'batchd'; "
     "did you mean 'batched'? (parameter 'sampling' of actor 'consumer')"),
    ("optional_param", GOOD.replace("total: 3", "total: 3\n  tag: 5"),
     "t.yaml:3:8: settings.tag: expected str or None, got int 5 "
     "(parameter 'tag' of actor 'consumer')"),
    ("tuple_item", GOOD.replace("total: 3", "total: 3\n  layers: [1, two]"),
     "t.yaml:3:15: settings.layers[1]: expected int, got str 'two' "
     "(parameter 'layers' of actor 'consumer')"),
    ("dict_value", GOOD.replace("total: 3", "total: 3\n  weights: {a: heavy}"),
     "t.yaml:3:16: settings.weights.a: expected float, got str 'heavy' "
     "(parameter 'weights' of actor 'consumer')"),
    ("nested_unknown", GOOD.replace("total: 3", "total: 3\n  network: {hiden: 3}"),
     "t.yaml:3:13: settings.network.hiden: unknown field 'hiden'; did you mean 'hidden'? "
     "(parameter 'network' of actor 'consumer')"),
    ("nested_literal", GOOD.replace("total: 3", "total: 3\n  network: {activation: rleu}"),
     "t.yaml:3:25: settings.network.activation: expected 'relu' or 'tanh', got str 'rleu'; "
     "did you mean 'relu'? (parameter 'network' of actor 'consumer')"),
    ("post_init_check", "processes:\n  main:\n    actors:\n      c:\n"
                        "        class: sample_actors:Checked\n        params: {low: 5}\n",
     # the check names its field first: the error points at that field
     "t.yaml:6:23: processes.main.actors.c.params.low: low (5) must not exceed high (1)"),
    ("bad_slot_declaration", GOOD.replace("sample_actors:Consumer", "sample_actors:BadSlot"),
     "t.yaml:9:16: processes.main.actors.consumer.class: 'sample_actors:BadSlot': slot "
     "BadSlot.on_anything: annotate its parameter with a sfbus.Message subclass"),
    ("name_type", "name: 5\n", "t.yaml:1:7: name: expected str, got int 5"),
    ("run_unknown", GOOD + "run:\n  heartbeat_timeout: 3\n",
     "t.yaml:14:3: run.heartbeat_timeout: unknown run setting 'heartbeat_timeout'; "
     "did you mean 'heartbeat_timeout_s'?"),
    ("run_type", GOOD + "run:\n  metrics_port: http\n",
     "t.yaml:14:17: run.metrics_port: expected int, got str 'http'"),
    ("connections_mapping", GOOD.split("connections:")[0] + "connections:\n  x: 1\n",
     "t.yaml:11:3: connections: expected a list of connections, got a mapping"),
    ("connection_not_mapping", GOOD + "  - producer.item_ready\n",
     "t.yaml:13:5: connections[1]: expected a mapping, got str 'producer.item_ready'"),
    ("connection_unknown_key", GOOD + "    mod: any\n",
     "t.yaml:13:5: connections[0].mod: unknown key 'mod'; did you mean 'mode'?"),
    ("connection_missing_to", GOOD + "  - from: producer.item_ready\n",
     "t.yaml:13:5: connections[1]: missing required key 'to'"),
    ("endpoint_format", GOOD.replace("from: producer.item_ready", "from: producer"),
     "t.yaml:11:11: connections[0].from: expected 'actor.signal', got 'producer'"),
    ("unknown_actor", GOOD.replace("from: producer.item_ready", "from: prodcer.item_ready"),
     "t.yaml:11:11: connections[0].from: unknown actor 'prodcer'; did you mean 'producer'?"),
    ("unknown_slot", GOOD.replace("to: consumer.on_item_ready", "to: consumer.on_itemready"),
     "t.yaml:12:9: connections[0].to: unknown slot 'on_itemready' of actor 'consumer'; "
     "did you mean 'on_item_ready'?"),
    ("slot_is_not_signal", GOOD.replace("from: producer.item_ready", "from: consumer.on_finished"),
     "t.yaml:11:11: connections[0].from: unknown signal 'on_finished' of actor 'consumer'"),
    ("payload_mismatch", GOOD.replace("from: producer.item_ready", "from: producer.finished"),
     "t.yaml:12:9: connections[0].to: signal 'finished' of actor 'producer' carries Empty but "
     "slot 'on_item_ready' of actor 'consumer' expects Item"),
    ("bad_mode", GOOD + "    mode: brodcast\n",
     "t.yaml:13:11: connections[0].mode: expected one of 'broadcast', 'any', 'local', got str "
     "'brodcast'; did you mean 'broadcast'?"),
    ("negative_coalesce", GOOD + "    coalesce_s: -1\n",
     "t.yaml:13:17: connections[0].coalesce_s: must be >= 0, got -1"),
    ("duplicate_connection", GOOD + "  - {from: producer.item_ready, to: consumer.on_item_ready}\n",
     "t.yaml:13:5: connections[1]: duplicate connection (same as connections[0])"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_errors_are_located_one_liners(load, text: str, expected: str) -> None:
    assert error_of(load, text) == expected


def test_extends_error_points_into_base_file(load, tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(GOOD.replace("total: 3", "total: many"), encoding="utf-8")
    assert error_of(load, "extends: base.yaml\nname: child\n") == (
        "base.yaml:2:10: settings.total: expected int, got str 'many' "
        "(parameter 'total' of actor 'consumer')")


def test_child_value_is_located_in_child(load, tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(GOOD, encoding="utf-8")
    assert error_of(load, "extends: base.yaml\nsettings:\n  total: x\n") == (
        "t.yaml:3:10: settings.total: expected int, got str 'x' "
        "(parameter 'total' of actor 'consumer')")


def test_extends_must_be_a_path(load) -> None:
    assert error_of(load, "extends: [a.yaml]\n") == (
        "t.yaml:1:10: extends: expected a file path, got a list")


# ----- the converter on its own --------------------------------------------------------------


@pytest.mark.parametrize(("value", "tp", "expected"), [
    (3, float, 3.0),
    ([1, "a"], tuple[int, str], (1, "a")),
    (None, int | None, None),
    ("x", int | str, "x"),
    ({"a": [1]}, dict[str, list[int]], {"a": [1]}),
    (1e6, int, 1_000_000),  # an integer written with an exponent
    (2**63 - 1, int, 2**63 - 1),
    (-0.0, float, 0.0),
    (0.01, Interval, 0.01),
])
def test_convert_accepts(value, tp, expected) -> None:
    assert convert(value, tp) == expected


@pytest.mark.parametrize(("value", "tp", "message"), [
    (True, int, "expected int, got bool True"),
    (1, bool, "expected bool, got int 1"),
    ([1], tuple[int, int], "expected tuple[int, int] (2 items), got 1 items"),
    (1.5, int | str, "expected int or str, got float 1.5"),
    ("x" * 50, int, "expected int, got str 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx..."),
    (1e6 + 0.5, int, "expected int, got float 1000000.5"),
    (float("nan"), int, "expected int, got float nan"),
    (2**63, int, "expected an int of at most 64 bits, got int 9223372036854775808"),
    (-2**63 - 1, int, "expected an int of at most 64 bits, got int -9223372036854775809"),
    (float("nan"), float, "expected a finite float, got float nan"),
    (float("-inf"), float | None, "expected a finite float, got float -inf"),
    ({"a": float("inf")}, dict[str, float], "expected a finite float, got float inf"),
    (1e-300, Interval, "expected a number in 0.01..1e+07, got float 1e-300"),
    (0, Annotated[int, Range(1, 8)], "expected a number in 1..8, got int 0"),
])
def test_convert_rejects(value, tp, message: str) -> None:
    with pytest.raises(ParamError) as info:
        convert(value, tp)
    assert info.value.message == message
