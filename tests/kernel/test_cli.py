"""The command line: validate, graph, clean, and one-line errors with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from sfbus.cli import main

SUM_DEMO = str(Path(__file__).parents[2] / "topologies" / "sum_demo.yaml")


def test_validate_summarises(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", SUM_DEMO]) == 0
    assert capsys.readouterr().out == f"{SUM_DEMO}: ok (2 processes, 2 actors, 2 connections)\n"


@pytest.mark.parametrize("fmt, needle", [("mermaid", "flowchart LR"), ("dot", "digraph")])
def test_graph_formats(fmt: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", SUM_DEMO, "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert needle in out and "item_ready" in out and "on_item_consumed" in out


def test_bad_set_value_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", SUM_DEMO, "--set", "count=many"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: --set: settings.count: expected int, got str 'many'")


def test_missing_file_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "nowhere.yaml"]) == 2
    assert capsys.readouterr().err == "error: nowhere.yaml: file not found\n"


def test_resume_of_a_non_run_directory_is_exit_2(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", SUM_DEMO, "--resume", str(tmp_path)]) == 2
    assert "not a run directory (no run.json)" in capsys.readouterr().err


def test_clean_reports_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clean"]) == 0
    assert capsys.readouterr().out.endswith("stale segment(s) removed\n")


def test_impossible_sizes_are_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    topologies = Path(__file__).parents[2] / "topologies"
    base = (topologies / "appo_local_inference.yaml").read_text().splitlines()
    line = next(n for n, text in enumerate(base, 1) if text.strip().startswith("rollout: {class"))
    assert main(["validate", str(topologies / "doom_basic_sync.yaml"), "--set", "num_envs=6"]) == 2
    assert capsys.readouterr().err == (
        f"error: {topologies / 'appo_local_inference.yaml'}:{line}:7: actor 'rollout': "
        "sync mode: batch_size 1024 "
        "must be a multiple of rollout x agents = 32 x 12 (every agent of every worker "
        "contributes the same number of trajectories)\n")
