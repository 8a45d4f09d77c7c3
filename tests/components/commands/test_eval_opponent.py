"""``sfbus eval --opponent``: a run's policy against a fixed opponent, a league snapshot or a
learner checkpoint, with the matches' outcomes in the CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from sfbus.cli import main
from sfbus_components.league.store import SnapshotStore
from sfbus_components.learning.checkpoint import latest_checkpoint
from tests.components.commands.test_enjoy import make_run

ROCK, PAPER = 0, 1


def always(action: int, state: dict) -> dict:
    """The policy ``state`` changed to play ``action`` whatever it sees."""
    state = dict(state)
    state["model.actor.weight"] = torch.zeros_like(state["model.actor.weight"])
    bias = torch.zeros_like(state["model.actor.bias"])
    bias[action] = 20.0
    state["model.actor.bias"] = bias
    return state


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A league_rps run directory whose policy 0 always plays paper."""
    run_dir = make_run(tmp_path_factory.mktemp("eval") / "rps", "league_rps.yaml")
    path = latest_checkpoint(run_dir / "checkpoints" / "policy_0")
    state = torch.load(path, weights_only=True)
    state["policy"] = always(PAPER, state["policy"])
    torch.save(state, path)
    return run_dir


def rows_of(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def test_a_snapshot_and_a_checkpoint_are_fixed_opponents(paper_run, tmp_path, capsys):
    checkpoint = latest_checkpoint(paper_run / "checkpoints" / "policy_0")
    state = torch.load(checkpoint, weights_only=True)["policy"]
    rock = always(ROCK, state)
    # a league snapshot holds the published vector: parameters, then buffers (this model's
    # state order)
    store = SnapshotStore(tmp_path / "league")
    snapshot = store.add(0, 1, 0, torch.cat([t.reshape(-1).float() for t in rock.values()]),
                         "first")
    code = main(["eval", str(paper_run), "--opponent", str(store.folder / snapshot.file),
                 "--episodes", "3", "--envs", "2", "--deterministic", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = rows_of(tmp_path / "eval_policy_0.csv")
    assert [r["agent"] for r in rows[:-1]] == ["0", "0", "0"]  # the evaluated policy's alone
    assert {(r["return"], r["win"]) for r in rows[:-1]} == {("8.0", "1.0")}  # paper beats rock
    assert rows[-1]["win"] == "1.0" and "win rate 1.000" in out

    code = main(["eval", str(paper_run), "--opponent", str(checkpoint), "--episodes", "2",
                 "--deterministic", "--out", str(tmp_path)])
    capsys.readouterr()
    assert code == 0
    rows = rows_of(tmp_path / "eval_policy_0.csv")
    assert {(r["return"], r["win"]) for r in rows[:-1]} == {("0.0", "0.5")}  # paper vs paper


def test_an_opponent_that_cannot_play_is_one_error_line(paper_run, tmp_path, capsys):
    missing = tmp_path / "nothing.pt"
    assert main(["eval", str(paper_run), "--opponent", str(missing)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --opponent {missing}: cannot read it")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(5)}, other)
    assert main(["eval", str(paper_run), "--opponent", str(other)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "a snapshot of 5 weights; this run's model has" in line
    assert not (paper_run / "eval").exists()  # refused before anything played
