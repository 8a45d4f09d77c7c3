"""A run given no seed draws one at random, prints it and records it in its snapshot, so that
unseeded runs differ and one can be repeated with ``--seed``; ``--resume`` keeps it. The notes
on shared Sample Factory names are printed once by the launcher, not by every process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sfbus.cli import main

ROOT = Path(__file__).resolve().parents[3]
CARTPOLE = str(ROOT / "topologies" / "cartpole.yaml")
DRAWN = re.compile(r"^note: seed (\d+) drawn at random \(no seed setting\); repeat this run with "
                   r"--seed (\d+)$", re.MULTILINE)


def sfbus_run(*args: str) -> str:
    """``sfbus run`` of a few hundred CartPole frames; its stderr."""
    done = subprocess.run([sys.executable, "-m", "sfbus", "run", *args, "--max-frames", "300"],
                          capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def recorded_seed(run_dir: Path) -> int:
    """The seed in the run's snapshot, the settings ``--resume`` runs again."""
    return yaml.safe_load((run_dir / "topology.yaml").read_text())["settings"]["seed"]


@pytest.mark.multiprocess
def test_unseeded_runs_draw_and_record_a_seed_that_resume_keeps(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    err = sfbus_run(CARTPOLE, "--run-dir", str(first))
    drawn = DRAWN.findall(err)
    assert len(drawn) == 1 and drawn[0][0] == drawn[0][1]
    seed = int(drawn[0][0])
    assert recorded_seed(first) == seed
    assert json.loads((first / "history.jsonl").read_text())["set"] == [f"seed={seed}"]
    # the notes on shared names come once, from the launcher, though three processes ran
    assert err.count("note: batch_size 512 ") == 1
    assert err.count("note: appo.num_epochs 2 ") == 1

    sfbus_run(CARTPOLE, "--serial", "--run-dir", str(second))
    assert recorded_seed(second) != seed  # 1 chance in 2**32 to fail

    # given the topology file again, the seed it lacks is not a difference worth a note
    err = sfbus_run(CARTPOLE, "--resume", str(first), "--serial")
    assert not DRAWN.search(err) and "differs at" not in err
    assert recorded_seed(first) == seed


def test_a_given_seed_is_kept_and_nothing_is_drawn(tmp_path):
    err = sfbus_run(CARTPOLE, "--serial", "--seed", "12345", "--run-dir", str(tmp_path / "a"))
    assert not DRAWN.search(err)
    assert recorded_seed(tmp_path / "a") == 12345


def test_a_refused_run_is_one_error_line_without_notes(tmp_path, capsys):
    taken = tmp_path / "file"
    taken.write_text("")
    assert main(["run", CARTPOLE, "--run-dir", str(taken)]) == 2
    assert capsys.readouterr().err == f"error: {taken}: not a directory\n"
