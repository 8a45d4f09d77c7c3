"""The data path declared once (#40 item 3): the rollout actor's parameters are the run's data
path, the DataPath record carries them, and no other actor's ``Params`` repeats them."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import sfbus_components
from sfbus import Actor
from sfbus.cli import main
from sfbus.routing import RoutingTable
from sfbus.topology import load_topology
from sfbus_components.datapath.record import DataPath, TrajectoryWriter
from sfbus_components.datapath.settings import DataPathParams

TOPOLOGIES = Path(__file__).parents[3] / "topologies"
DATA_PATH = frozenset(f.name for f in dataclasses.fields(DataPathParams))

def actor_classes() -> dict[str, type[Actor]]:
    """Every actor class defined in sfbus_components, by import path."""
    found = {}
    for module in pkgutil.walk_packages(sfbus_components.__path__, "sfbus_components."):
        loaded = importlib.import_module(module.name)
        for name, value in vars(loaded).items():
            if inspect.isclass(value) and issubclass(value, Actor) \
                    and value.__module__ == loaded.__name__:
                found[f"{loaded.__name__}:{name}"] = value
    return found


def test_only_the_rollout_actor_declares_the_data_path() -> None:
    classes = actor_classes()
    assert "sfbus_components.sampling.inference_worker:InferenceWorker" in classes
    repeated = {}
    for path, cls in classes.items():
        if issubclass(cls, TrajectoryWriter) or not dataclasses.is_dataclass(cls.Params):
            continue
        fields = {f.name for f in dataclasses.fields(cls.Params)} & DATA_PATH
        if fields:
            repeated[path] = sorted(fields)
    assert not repeated, f"actors whose Params repeat the data path's fields (read them from " \
                         f"context.records[DataPath].params instead): {repeated}"


def test_the_record_carries_the_settings_as_the_rollout_actor_reads_them() -> None:
    topology = load_topology(TOPOLOGIES / "cartpole.yaml", ["batch_size=1024", "num_envs=4"])
    record = RoutingTable(topology).records[DataPath]
    [rollout] = topology.actors_of(TrajectoryWriter)
    assert record.params == DataPathParams(**{name: getattr(rollout.spec.params, name)
                                              for name in DATA_PATH})
    assert (record.params.env, record.params.batch_size, record.params.num_envs,
            record.params.trajectories_per_batch) == ("gym:CartPole-v1", 1024, 4, 32)


def test_the_learners_checks_against_the_data_path_are_located_errors(
        capsys: pytest.CaptureFixture[str]) -> None:
    # APPO's settings (the learner's) against T and the batch (the rollout actor's): refused by
    # `sfbus validate` at the learner's place in the file, exit 2, one line
    assert main(["validate", str(TOPOLOGIES / "cartpole.yaml"), "--set",
                 "appo.recurrence=5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert re.fullmatch(r"error: \S+/topologies/appo\.yaml:\d+:\d+: actor 'learner': "
                        r"appo\.recurrence \(5\) must divide the rollout \(32\)\n", err), err
    assert main(["validate", str(TOPOLOGIES / "cartpole.yaml"), "--set",
                 "appo.recurrence=8"]) == 0
