"""The data path's run record: computed once from a topology, the values every actor reads."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import sfbus_components.datapath.record as record_module
from sfbus import TopologyError, load_topology
from sfbus.routing import RoutingTable
from sfbus_components.datapath.buffers import TrajectoryLayout
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.settings import published_size
from sfbus_components.envs.spec import EnvSpec, ObsField

TOPOLOGIES = Path(__file__).parents[3] / "topologies"


def test_the_record_of_a_population_with_three_workers() -> None:
    topology = load_topology(TOPOLOGIES / "cartpole_pbt4.yaml", ["processes.rollout.replicas=3"])
    data_path = DataPath.from_topology(topology)
    spec = EnvSpec({"obs": ObsField((4,), "float32")}, action_heads=(2,))
    # 16 agents per worker being filled, plus 4 policies x 2 batches x 8 trajectories over 3
    # workers, rounded up: 16 + ceil(64 / 3) slots
    assert data_path.layout == TrajectoryLayout(spec, rollout=32, state_size=0, slots=38,
                                                splits=2, rows_per_split=8)
    assert data_path.workers == ("rollout.0", "rollout.1", "rollout.2")
    rollout = next(a.params for p in topology.processes for a in p.actors if a.name == "rollout")
    assert data_path.weights == (published_size(rollout),) * 4
    assert data_path.weights_size(3) == data_path.weights[3]
    assert data_path.spec is data_path.layout.spec
    # what run.json holds decodes to the same record
    assert msgspec.json.decode(msgspec.json.encode(data_path), type=DataPath) == data_path


def test_one_model_is_built_for_a_whole_population(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    monkeypatch.setattr(record_module, "published_size",
                        lambda params: built.append(params) or published_size(params))
    topology = load_topology(TOPOLOGIES / "cartpole_pbt4.yaml", ["num_policies=16"])
    names = {spec.name for spec in RoutingTable(topology).array_specs()}  # as `sfbus validate`
    assert len(built) == 1
    assert {f"policy.{i}.weights" for i in range(16)} <= names


def test_a_policy_the_run_does_not_train_has_no_weights_size() -> None:
    data_path = DataPath.from_topology(load_topology(TOPOLOGIES / "cartpole.yaml"))
    with pytest.raises(ValueError, match=r"policy 1 does not exist: the run trains policies "
                                         r"0\.\.0 \(settings\.num_policies\)"):
        data_path.weights_size(1)


def test_a_topology_with_two_rollout_actors_is_located(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(f"extends: {TOPOLOGIES / 'cartpole.yaml'}\n"
                    "processes: {more: {actors: {rollout_b: "
                    "{class: sfbus_components.sampling.rollout_worker:RolloutWorker}}}}\n")
    with pytest.raises(TopologyError, match="actor 'rollout': the data path takes one rollout "
                                            "actor \\(a TrajectoryWriter subclass\\); the "
                                            "topology has 'rollout', 'rollout_b'"):
        RoutingTable(load_topology(path)).array_specs()
