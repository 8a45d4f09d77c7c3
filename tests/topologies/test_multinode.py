"""Two "nodes" on one machine: two ``sfbus run`` trees whose learners average gradients (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernel.runs import free_port, start_run

TOPOLOGIES = Path(__file__).parents[2] / "topologies"
# Tiny batches: many learner steps in a few seconds on a shared 2-core machine.
SMALL = ["--set", "num_envs=4", "--set", "rollout=16", "--set", "batch_size=64"]


def _audit(run_dir: Path) -> list[dict]:
    path = run_dir / "logs" / "distributed_policy_0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_two_nodes_hold_identical_weights_after_every_step(tmp_path: Path) -> None:
    master = f"127.0.0.1:{free_port()}"
    runs = [start_run(TOPOLOGIES / "cartpole.yaml", tmp_path / f"node{rank}", "--nodes", "2",
                      "--node-rank", str(rank), "--master", master, "--max-seconds", "6", *SMALL)
            for rank in (0, 1)]
    for run in runs:
        _, stderr = run.communicate(timeout=100)
        assert run.returncode == 0, stderr[-3000:]
        assert " raised " not in stderr, stderr[-3000:]
    first, second = (_audit(tmp_path / f"node{rank}") for rank in (0, 1))
    common = min(len(first), len(second))
    assert common >= 3, (first, second)
    for mine, theirs in zip(first[:common], second[:common], strict=True):
        assert (mine["rank"], theirs["rank"]) == (0, 1)
        assert mine["step"] == theirs["step"]
        assert mine["checksum"] == theirs["checksum"], (mine, theirs)
        for line in (mine, theirs):  # each update averaged both nodes' batches
            assert line["world_size"] == 2 and line["samples"] == 64
            assert line["group_samples"] == 2 * line["samples"]
    assert len({line["checksum"] for line in first}) == len(first)  # and every update trained


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sfbus", "run", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("flags", "message"), [
    (["--nodes", "2", "--node-rank", "2", "--master", "127.0.0.1:29500"],
     "error: --node-rank 2: must be one of 0..1"),
    (["--nodes", "2", "--master", "127.0.0.1:29500"],
     "error: --nodes 2 needs --node-rank and --master"),
    (["--nodes", "2", "--node-rank", "0", "--master", "localhost"],
     "error: --master 'localhost': expected HOST:PORT, e.g. 10.0.0.1:29500"),
    (["--nodes", "2", "--node-rank", "0", "--master", "h:99999"],
     "error: --master 'h:99999': expected HOST:PORT, e.g. 10.0.0.1:29500"),
    (["--node-rank", "1"], "error: --node-rank and --master need --nodes"),
])
def test_bad_node_flags_are_exit_2(flags: list[str], message: str, tmp_path: Path) -> None:
    done = _run_cli(str(TOPOLOGIES / "cartpole.yaml"), "--run-dir", str(tmp_path / "run"), *flags)
    assert (done.returncode, done.stderr.strip()) == (2, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("flags", "env"), [
    (["--nodes", "2", "--node-rank", "0", "--master", "127.0.0.1:29500"], {}),
    ([], {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}),
], ids=["flags", "torchrun"])
def test_populations_cannot_be_distributed(flags: list[str], env: dict[str, str],
                                           tmp_path: Path) -> None:
    done = _run_cli(str(TOPOLOGIES / "cartpole_pbt4.yaml"), "--run-dir", str(tmp_path / "run"),
                    *flags, env=env)
    assert done.returncode == 2
    assert "distributed mode (WORLD_SIZE 2) is not supported with several policies" in done.stderr
    assert not (tmp_path / "run").exists()
