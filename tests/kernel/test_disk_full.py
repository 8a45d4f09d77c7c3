"""A real full disk: the run directory on a small tmpfs that is filled (skipped where this
machine cannot mount one: it needs root)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess
SUM_DEMO = Path(__file__).parents[2] / "topologies" / "sum_demo.yaml"


def _fill(folder: Path) -> None:
    """Write ``folder/filler`` until the disk is full."""
    with (folder / "filler").open("wb") as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        except OSError:
            pass


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, filled to the last byte."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or 'not root'})")
    try:
        _fill(mount)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("where", ["new", "made"])
def test_a_new_run_on_a_full_disk_is_one_error_line(full_disk: Path, where: str) -> None:
    run_dir = full_disk / "run"
    if where == "made":  # the folder exists (made before the disk filled): its files fail
        (full_disk / "filler").unlink()
        run_dir.mkdir()
        _fill(full_disk)
    done = subprocess.run([sys.executable, "-m", "sfbus", "run", str(SUM_DEMO), "--run-dir",
                           str(run_dir)], capture_output=True, text=True, timeout=60,
                          cwd=SUM_DEMO.parents[1])
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "No space left on device" in line, line
