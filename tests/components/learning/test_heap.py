"""keep_freed_memory: a big block freed and allocated again soon costs no page faults."""

from __future__ import annotations

import subprocess
import sys

import pytest

# In a child process: the setting is process-wide and would outlive the test here.
_PROBE = """
import resource, sys, torch
from sfbus_components.learning.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
for _ in range(30):  # glibc's heap takes a few rounds to settle (7 here)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB: above glibc's mmap threshold
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del block
print(faults)
"""


def _faults_of_last_allocation(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_freed_big_block_is_reused_without_page_faults():
    pages = (64 << 20) // 4096
    assert _faults_of_last_allocation("default") > pages // 2  # mapped afresh every time
    assert _faults_of_last_allocation("keep") < pages // 20
