"""Moved import paths keep working: a topology or run directory written before a move loads."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sfbus import import_object, validate_topology
from sfbus_components.moved import MOVED
from sfbus_components.sampling.rollout_worker import RolloutWorker
from tests.kernel.runs import start_run

ROOT = Path(__file__).resolve().parents[2]
FLAT = Path(__file__).parent / "fixtures" / "cartpole_flat_components.yaml"
SMALL = ("--set", "num_envs=4", "--set", "batch_size=256", "--set", "appo.num_epochs=1",
         "--set", "report_every_s=0.5")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_move_leads_to_what_is_there(old: str) -> None:
    new = MOVED[old]
    if ":" in new:
        import_object(new)
    else:
        importlib.import_module(new.rstrip("."))


def test_old_paths_of_each_layout_import() -> None:
    assert import_object("components.rollout:RolloutWorker") is RolloutWorker  # before #16
    assert import_object("components.sampling.rollout_worker:RolloutWorker") is RolloutWorker
    assert import_object("sfbus_components.sampling.rollout_worker:RolloutWorker") is \
        RolloutWorker
    # a module that became a package of the same name: its old module and its new package
    assert import_object("components.pbt:PopulationTrainer") is \
        import_object("sfbus_components.pbt.trainer:PopulationTrainer")
    assert import_object("components.envs.doom.duel:DoomDuelEnv") is \
        import_object("sfbus_components.envs.doom.duel:DoomDuelEnv")


def test_a_missing_name_under_a_move_says_where_it_looked() -> None:
    with pytest.raises(ValueError, match=r"^'components.rollout:RollotWorker' moved to "
                       r"'sfbus_components.sampling.rollout_worker:RollotWorker': module "
                       r"'sfbus_components.sampling.rollout_worker' has no attribute "
                       r"'RollotWorker'; did you mean 'RolloutWorker'\?"):
        import_object("components.rollout:RollotWorker")


def test_a_snapshot_of_the_flat_layout_validates() -> None:
    topology = validate_topology(str(FLAT))
    assert {a.class_path for p in topology.processes for a in p.actors} >= {
        "components.rollout:RolloutWorker", "components.learner:Learner"}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_run_directory_of_the_flat_layout_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = start_run(ROOT / "topologies" / "cartpole.yaml", run_dir, *SMALL,
                      "--max-frames", "1500")
    _out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err[-3000:]
    # the run directory as sfbus wrote it before the moves: its snapshot names the old paths
    shutil.copy(FLAT, run_dir / "topology.yaml")
    resumed = subprocess.run([sys.executable, "-m", "sfbus", "run", "--resume", str(run_dir),
                              *SMALL, "--max-frames", "3000"],
                             capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = (run_dir / "logs" / "learner.log").read_text()
    assert re.search(r"resumed from \S+checkpoint_\d+\.pt \(version \d+\)", log), log[-2000:]
    # and plays back: enjoy reads env and model from the old snapshot's rollout actor
    shutil.copy(FLAT, run_dir / "topology.yaml")  # the snapshot as written before the moves
    played = subprocess.run([sys.executable, "-m", "sfbus", "enjoy", str(run_dir),
                             "--episodes", "1", "--seed", "0"],
                            capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert played.returncode == 0 and "env gym:CartPole-v1" in played.stdout, played.stderr
