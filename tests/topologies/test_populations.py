"""A population's size is one setting: the population topologies at 1, 3 and 16 policies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sfbus.routing import RoutingTable
from sfbus.topology import load_topology
from sfbus_components.pbt.trainer import population_learners

TOPOLOGIES = Path(__file__).parents[2] / "topologies"
POPULATIONS = ["pbt8", "cartpole_pbt4", "selfplay_duel"]
SHARED, PER_POLICY = 9, 15  # connections of the population files: shared, and each policy's


@pytest.mark.parametrize("count", [1, 3, 16])
@pytest.mark.parametrize("name", POPULATIONS)
def test_population_size_is_one_setting(name: str, count: int) -> None:
    topology = load_topology(TOPOLOGIES / f"{name}.yaml", [f"num_policies={count}"])
    assert sorted(population_learners(topology, count)) == list(range(count))
    batchers = {a.params.policy: a.name for p in topology.processes for a in p.actors
                if a.template == "batcher_<policy>"}
    assert batchers == {i: f"batcher_{i}" for i in range(count)}
    assert len(topology.connections) == SHARED + PER_POLICY * count
    for policy in range(count):
        own = [c for c in topology.connections if c.index == policy]
        assert len(own) == PER_POLICY
        # both ends of a per-policy connection belong to the same policy
        assert all(end.endswith(f"_{policy}") for c in own for end in (c.source, c.target)
                   if end.startswith(("learner_", "batcher_"))), own


# Sizing builds one model for the whole population (sfbus_components.datapath.record), so 16
# policies validate about as fast as one.
@pytest.mark.parametrize("count", [1, 3, 16])
def test_pbt8_validates_at_any_size(count: int) -> None:
    topology = load_topology(TOPOLOGIES / "pbt8.yaml", [f"num_policies={count}"])
    names = {spec.name for spec in RoutingTable(topology).array_specs()}  # as `sfbus validate`
    assert {f"policy.{i}.weights" for i in range(count)} <= names
    assert f"policy.{count}.weights" not in names


def test_a_connection_to_a_policy_that_does_not_exist_is_located(tmp_path: Path) -> None:
    path = tmp_path / "pbt3.yaml"
    path.write_text(f"extends: {TOPOLOGIES / 'pbt8.yaml'}\n"
                    "settings: {num_policies: 3}\n"
                    "connections:\n"
                    "  - {from: pbt.replace_policy, to: learner_3.on_replace_policy}\n")
    done = subprocess.run([sys.executable, "-m", "sfbus", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, (
        f"error: {path}:4:36: connections[0].to: unknown actor 'learner_3': policy 3 does not "
        "exist: 'learner_<policy>' has one actor per policy 0..2 (settings.num_policies = 3)\n"))


@pytest.mark.multiprocess
@pytest.mark.timeout(180)  # above the run's own limit
def test_a_population_of_three_trains_three_learners(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGIES / "cartpole_pbt4.yaml"),
         "--run-dir", str(run_dir), "--max-frames", "20000", "--set", "num_policies=3"],
        capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    last = json.loads((run_dir / "progress.jsonl").read_text().splitlines()[-1])["policies"]
    assert sorted(last) == ["0", "1", "2"], last
    assert all(last[p]["version"] >= 2 and last[p]["episodes"] > 0 for p in last), last
    saved = sorted(d.name for d in (run_dir / "checkpoints").iterdir() if d.name != "pbt")
    assert saved == ["policy_0", "policy_1", "policy_2"]
    assert all(list((run_dir / "checkpoints" / d).glob("checkpoint_*.pt")) for d in saved)
