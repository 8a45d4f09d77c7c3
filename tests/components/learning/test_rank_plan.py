"""Several ranks on one machine (torchrun --nproc-per-node G): each computes its own share of the
cores and its GPU, so no two ranks pin their rollout workers to the same cores or put their
learners and inference on GPU 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sfbus.child import pinned_cores
from sfbus_components.learning.nodes import core_share
from sfbus_components.models.device import gpu_index

ROOT = Path(__file__).parents[3]


@pytest.mark.parametrize(("cores", "ranks"), [(16, 4), (16, 3), (2, 2), (7, 2), (12, 1)])
def test_each_rank_takes_a_contiguous_share_and_together_they_take_every_core(
        cores: int, ranks: int) -> None:
    machine = list(range(100, 100 + cores))  # ids need not start at 0 (a taskset share)
    shares = [core_share(machine, r, ranks) for r in range(ranks)]
    assert sorted(c for share in shares for c in share) == machine
    for share in shares:
        assert share == list(range(share[0], share[0] + len(share)))
        assert cores // ranks <= len(share) <= -(-cores // ranks)


def test_more_ranks_than_cores_share_cores_round_robin() -> None:
    assert [core_share([4, 5], r, 4) for r in range(4)] == [[4], [5], [4], [5]]
    with pytest.raises(ValueError, match="LOCAL_RANK 4 is not below LOCAL_WORLD_SIZE 4"):
        core_share([4, 5], 4, 4)


def test_ranks_take_one_gpu_each_and_one_ranks_policies_spread() -> None:
    assert [gpu_index(0, rank, 4) for rank in range(4)] == [0, 1, 2, 3]
    assert [gpu_index(policy, 0, 4) for policy in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [gpu_index(0, rank, 2) for rank in range(4)] == [0, 1, 0, 1]


def test_a_processs_core_ids_count_within_the_cores_the_run_was_given() -> None:
    assert pinned_cores([0], {8, 9, 10, 11}) == {8}
    assert pinned_cores([1, 5], {8, 9, 10, 11}) == {9}
    assert pinned_cores([0, 1], set(range(16))) == {0, 1}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to split")
def test_a_rank_launcher_keeps_its_share_before_anything_starts() -> None:
    """The real launch path: sfbus run's registered options applied under torchrun's variables
    for rank 1 of 2 (stopping before the run at a missing topology)."""
    code = ("import os, json, sys; from sfbus.cli import build_parser\n"
            "args = build_parser().parse_args(['run', 'none.yaml'])\n"
            "suffix = ''.join(apply(args) for apply in args.run_options)\n"
            "print(json.dumps([sorted(os.sched_getaffinity(0)), suffix]))")
    cores = sorted(os.sched_getaffinity(0))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT,
                          env={**os.environ, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert done.returncode == 0, done.stderr
    share, suffix = json.loads(done.stdout)
    assert share == cores[len(cores) // 2:] and suffix == ""
    assert f"note: local rank 1 of 2: cores {','.join(map(str, share))}" in done.stderr
