"""Population-based training through real processes: a population of 4 on CartPole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sfbus.topology import load_topology
from sfbus_components.learning.checkpoint import checkpoint_path, latest_checkpoint, load_checkpoint
from sfbus_components.learning.population_member import snapshot_dir
from sfbus_components.pbt.trainer import population_learners
from tests.short_runs import records, run_until

TOPOLOGIES = Path(__file__).parents[2] / "topologies"


@pytest.mark.parametrize("name, size", [("cartpole_pbt4", 4), ("pbt8", 8)])
def test_population_topologies_have_one_learner_per_policy(name: str, size: int) -> None:
    topology = load_topology(TOPOLOGIES / f"{name}.yaml")
    assert topology.settings["num_policies"] == size
    assert sorted(population_learners(topology, size)) == list(range(size))
    with pytest.raises(ValueError, match=rf"policies without exactly one: \[{size}\]"):
        population_learners(topology, size + 1)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)  # above the run's own limit
def test_cartpole_population_mutates_and_exchanges_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    def exchanged_and_trained_on() -> bool:  # a policy that took weights trained them since
        versions = {p: v.get("version", 0) for r in records(run_dir)
                    for p, v in r["policies"].items()}  # each policy's last
        return any(versions.get(str(e["policy"]), 0) > e["version"]
                   for e in records(run_dir, "pbt_history.jsonl") if e["event"] == "exchange_done")

    # stopped once that has happened: what is checked below (at most 100k frames)
    code, err = run_until(
        TOPOLOGIES / "cartpole_pbt4.yaml", run_dir, "--max-frames", "100000",
        "--set", "interval=8000", "--set", "mutation_rate=0.5",
        "--set", "initial_mutation=true", "--set", "perturb_min=1.1", "--set", "perturb_max=1.5",
        "--set", "report_every_s=0.5", reached=exchanged_and_trained_on, timeout=120)
    assert code in (0, 130), err[-3000:]  # 130: stopped here, gracefully
    assert " raised " not in err, err[-3000:]

    history = records(run_dir, "pbt_history.jsonl")
    assert any(entry.get("mutations") for entry in history), history
    # Sample Factory 2.x's initial diversity: every policy but 0 starts mutated
    initial = [e for e in history if e["event"] == "initial_mutation"]
    assert sorted(e["policy"] for e in initial) == [1, 2, 3], history
    assert any(e["mutations"] for e in initial), initial
    exchanges = [e for e in history if e["event"] == "exchange_done"]
    assert exchanges, history
    assert latest_checkpoint(run_dir / "checkpoints" / "pbt") is not None

    compared, went_on = 0, 0
    for entry in reversed(exchanges):  # older files may have been pruned
        target = checkpoint_path(run_dir / "checkpoints" / f"policy_{entry['policy']}",
                                 entry["version"])
        snapshot = checkpoint_path(snapshot_dir(run_dir, entry["exchange"]),
                                   entry["source_version"])
        if not (target.exists() and snapshot.exists()):
            continue
        copied, source = load_checkpoint(target), load_checkpoint(snapshot)
        assert copied["policy"].keys() == source["policy"].keys()
        assert all(torch.equal(copied["policy"][k], source["policy"][k])
                   for k in source["policy"])
        assert copied["min_version"] == entry["version"]
        # training goes on after the exchange: the final checkpoint is newer
        went_on += load_checkpoint(latest_checkpoint(target.parent))["version"] > entry["version"]
        compared += 1
    assert compared and went_on, exchanges
