"""bench.arithmetic's operator breakdown: the profiler's operators ranked by self time."""

from __future__ import annotations

import torch

from bench.arithmetic import operator_table, top_operators


def test_top_operators_rank_by_self_time_and_keep_the_rest_as_other() -> None:
    big, small = torch.randn(256, 256), torch.randn(8)

    def run() -> None:
        torch.mm(big, big)
        small.add(1)

    ops = top_operators(run, calls=5, top=1)
    assert [name for name, _ in ops] == ["aten::mm", "other"]
    assert ops[0][1] > ops[1][1] > 0  # seconds per call: the product dominates, the add remains
    rows = operator_table("op", ops)
    assert rows[3].startswith("| `aten::mm` |") and rows[-1].startswith("| **total** |")
    shares = [int(row.split("|")[3].strip().rstrip("%")) for row in rows[3:-1]]
    assert 99 <= sum(shares) <= 101
