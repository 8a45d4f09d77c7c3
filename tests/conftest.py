"""Session-wide checks: the suite leaves nothing behind on the machine.

Every test that starts processes or shared memory cleans up after itself; this checks it once
for the whole session: no process started by this session outlives it, and no shared-memory
segment (sfbus's, VizDoom's, POSIX semaphores) or socket folder appeared that is still there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM = Path("/dev/shm")
# What this project's code makes outside a test's tmp_path: its segments and liveness locks,
# VizDoom's engine files, POSIX semaphores, socket folders that fell back to the temp dir.
_OURS = ("sfbus-", "ViZDoom", "sem.")
# VizDoom's files go a few seconds after their engine (sfbus_components/envs/doom/shm.py).
_GRACE_S = 10.0


def _descendants(root: int) -> dict[int, str]:
    """Processes below ``root`` now, pid to command line."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
            names[int(entry)] = Path("/proc", entry, "cmdline").read_bytes().replace(
                b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor and ancestor != root:
            ancestor = parents.get(ancestor)
        if ancestor == root and pid != root:
            found[pid] = names.get(pid, "?")
    return found


def _own_helper(pid: int, command: str) -> bool:
    """The test process's own multiprocessing helpers, which end when it does."""
    try:
        parent = int(Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return False
    return parent == os.getpid() and any(
        f"multiprocessing.{helper}" in command for helper in ("resource_tracker", "forkserver"))


def _left_files() -> set[str]:
    shm = {str(SHM / n) for n in os.listdir(SHM) if n.startswith(_OURS)} if SHM.is_dir() else set()
    temp = Path(tempfile.gettempdir())
    socks = {str(p) for p in temp.glob("sfbus-*") if p.is_dir() and not p.name.startswith(
        "sfbus-vizdoom-")}
    return shm | socks


@pytest.fixture(scope="session", autouse=True)
def _leaves_nothing_behind() -> Iterator[None]:
    before = _left_files()
    yield
    deadline = time.monotonic() + _GRACE_S
    while True:
        processes = {pid: cmd for pid, cmd in _descendants(os.getpid()).items()
                     if "pytest" not in cmd and not _own_helper(pid, cmd)}
        files = _left_files() - before
        if not (processes or files) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for pid in processes:  # so that the next session starts clean
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not processes, f"the test session left processes running: {processes}"
    assert not files, f"the test session left files behind: {sorted(files)}"
