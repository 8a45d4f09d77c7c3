"""Every topology under topologies/ loads, and runs briefly through real processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sfbus.routing import RoutingTable
from sfbus.topology import load_topology
from sfbus_components.datapath.settings import DataPathParams
from tests.short_runs import records, run_until

TOPOLOGIES = sorted((Path(__file__).parents[2] / "topologies").glob("*.yaml"))
# Small enough for a 2-core CI machine, large enough that every actor does its job: at most 4
# envs per rollout worker (a topology with fewer, such as selfplay_duel's one match, keeps its own).
SMALL_ENVS = 4
TESTS = Path(__file__).parents[1]
LEARNER = "sfbus_components.learning.learner:Learner"
STATS = "sfbus_components.monitoring.stats:Stats"
# Topologies a test of their own already runs through `sfbus run` (longer, with its checks):
# a brief run here would repeat it.
RUN_ELSEWHERE = {
    "atari_breakout": "topologies/test_atari_run.py",
    "cartpole": "topologies/test_learning.py",
    "cartpole_eval": "topologies/test_evaluator.py",
    "cartpole_pbt4": "topologies/test_pbt.py",
    "cartpole_population_member": "topologies/test_folder_population.py",
    "doom_basic": "topologies/test_learning.py",
    "doom_deathmatch_bots": "topologies/test_doom_bots_run.py",
    "league_duel": "topologies/test_league.py",
    "league_rps": "topologies/test_league.py",
    "mujoco_halfcheetah": "topologies/test_mujoco_run.py",
    "pettingzoo_simple_spread": "topologies/test_pettingzoo_run.py",
    "pettingzoo_simple_tag": "topologies/test_heterogeneous_run.py",
    "selfplay_duel": "topologies/test_selfplay.py",
}


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_topology_loads(path: Path) -> None:
    topology = load_topology(path)
    assert topology.processes


@pytest.mark.parametrize("cores", [1, 2, 4, 8])
@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_topology_is_valid_on_any_core_count(path: Path, cores: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # 'replicas: auto' and 'cpu_affinity: auto' follow the cores the run may use: a shipped
    # topology must stay valid on the CI machine and on a user's, whatever their count.
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    topology = load_topology(path)
    RoutingTable(topology).array_specs()  # sizes, sync-mode batch arithmetic, ...
    if path.stem == "doom_basic":  # the patched count is the one 'auto' reads
        assert {p.name: p.replicas for p in topology.processes}["rollout"] == cores


def test_the_gpu_default_differs_from_the_cpu_default_in_layout_only() -> None:
    # `make run` trains doom_basic_gpu.yaml where there is a GPU: the same scenario, sizes and
    # per-frame recipe as doom_basic.yaml, which its layout cannot extend.
    folder = TOPOLOGIES[0].parent
    assert (load_topology(folder / "doom_basic_gpu.yaml").settings
            == load_topology(folder / "doom_basic.yaml").settings)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)  # above the run's own 120 s limit
@pytest.mark.parametrize("path", [p for p in TOPOLOGIES if p.stem not in RUN_ELSEWHERE],
                         ids=lambda p: p.stem)
def test_topology_runs_briefly(path: Path, tmp_path: Path) -> None:
    """Up to 8 s of running, stopped gracefully as soon as every learner has trained on what the
    rollout and inference workers sampled and a batcher batched (a version of its policy in the
    progress records): by then every actor has done its job once."""
    topology = load_topology(path)
    settings = topology.settings
    run_dir = tmp_path / "run"
    overrides = []
    if "num_envs" in settings:
        overrides = ["--set", f"num_envs={min(SMALL_ENVS, settings['num_envs'])}",
                     "--set", "batch_size=256"]
    if settings.get("mode") == "sync":  # a batch: one trajectory of each env of its 2 workers
        rollout = settings.get("rollout", DataPathParams.rollout)
        overrides = ["--set", "num_envs=2", "--set", f"batch_size={2 * 2 * rollout}"]
    learners = {str(found.spec.params.policy) for found in topology.actors_of(LEARNER)}
    reports = bool(topology.actors_of(STATS))
    if reports:  # records often enough to see the first versions at once
        overrides += ["--set", "report_every_s=0.5"]

    def every_learner_trained() -> bool:
        trained = {p for r in records(run_dir) for p, figures in r["policies"].items()
                   if figures.get("version", 0) >= 1}
        return reports and bool(learners) and trained >= learners

    code, err = run_until(path, run_dir, "--max-seconds", "8", *overrides,
                          reached=every_learner_trained, timeout=120)
    assert code in (0, 130), err[-3000:]  # 130: stopped here, gracefully
    assert " raised " not in err, err[-3000:]


@pytest.mark.parametrize("stem", sorted(RUN_ELSEWHERE))
def test_a_topology_left_out_of_the_brief_runs_runs_in_its_own_test(stem: str) -> None:
    text = (TESTS / RUN_ELSEWHERE[stem]).read_text()
    assert (TESTS.parent / "topologies" / f"{stem}.yaml").is_file()
    assert f"{stem}.yaml" in text and '"run"' in text, f"{RUN_ELSEWHERE[stem]} runs no {stem}"
