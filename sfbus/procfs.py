"""What /proc says about the processes running now: their command lines, and a run's children."""

from __future__ import annotations

import os
from pathlib import Path


def command_lines() -> dict[int, list[str]]:
    """The arguments of every process alive now, by pid (those that exit meanwhile are left out)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        found[int(entry)] = raw.decode(errors="replace").split("\0")[:-1]
    return found


def run_children(run_dir: str | Path) -> dict[str, int]:
    """A run's child processes alive now, process name to pid: the supervisor starts each as
    ``python -m sfbus.child RUN_DIR NAME``."""
    needle = str(Path(run_dir).resolve())
    return {argv[argv.index("sfbus.child") + 2]: pid for pid, argv in command_lines().items()
            if "sfbus.child" in argv and needle in argv}
