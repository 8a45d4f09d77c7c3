"""Setting names shared with Sample Factory that mean something else here: one ``note:`` line per
name a topology sets, at validation and once at a run's start; the migration guide lists them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sfbus.cli import main
from sfbus_components.datapath.shared_names import DIFFERENCES

ROOT = Path(__file__).resolve().parents[3]
CARTPOLE = str(ROOT / "topologies" / "cartpole.yaml")
NOTE = re.compile(r"^note: (\S+) (\S+) .* \(docs/FROM_SAMPLE_FACTORY\.md\)$", re.MULTILINE)


def noted(capsys: pytest.CaptureFixture[str], *sets: str) -> dict[str, str]:
    """``sfbus validate cartpole.yaml --set ...``: the shared names it notes, with their values."""
    code = main(["validate", CARTPOLE, *(a for s in sets for a in ("--set", s))])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "ok (" in out
    return {m[1]: m[2] for m in NOTE.finditer(err)}


def test_a_name_given_is_noted_once_and_a_name_not_given_is_not(capsys):
    # cartpole.yaml sets batch_size and appo.num_epochs, nothing else of the list
    assert noted(capsys) == {"batch_size": "512", "appo.num_epochs": "2"}
    found = noted(capsys, "appo.with_vtrace=false", "appo.max_policy_lag=7",
                  "appo.shuffle_minibatches=false", "appo.num_batches_per_epoch=2")
    assert found == {"batch_size": "512", "appo.num_epochs": "2", "appo.with_vtrace": "false",
                     "appo.max_policy_lag": "7", "appo.shuffle_minibatches": "false",
                     "appo.num_batches_per_epoch": "2"}
    # names that mean the same thing in both get no note
    assert noted(capsys, "appo.gamma=0.98", "rollout=16", "appo.recurrence=16",
                 "num_batches_to_accumulate=1", "keep_checkpoints=2") == {
        "batch_size": "512", "appo.num_epochs": "2"}


def test_an_actors_own_parameter_is_noted_too(capsys):
    found = noted(capsys, "processes.learner.actors.learner.params.appo.max_policy_lag=3")
    assert found["appo.max_policy_lag"] == "3"


def test_the_migration_guide_lists_every_difference_and_no_other():
    text = (ROOT / "docs" / "FROM_SAMPLE_FACTORY.md").read_text()
    section = text.split("## Shared names that mean something else", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_.]+)` \|", section, re.MULTILINE)
    assert sorted(rows) == sorted(DIFFERENCES)
