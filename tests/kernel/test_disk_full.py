"""A real full disk: the run directory on a small tmpfs that is filled (skipped where this
machine cannot mount one: it needs root)."""

from __future__ import annotations

import contextlib
import errno
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sfbus.rundir import read_manifest
from sfbus.shm import SharedArray
from sfbus_components.datapath.buffers import version_name
from tests.kernel.runs import wait_for

pytestmark = pytest.mark.multiprocess
SUM_DEMO = Path(__file__).parents[2] / "topologies" / "sum_demo.yaml"
CARTPOLE = SUM_DEMO.parent / "cartpole.yaml"


def _fill(folder: Path) -> None:
    """Write ``folder/filler`` until the disk is full (unbuffered: nothing is left to flush)."""
    with (folder / "filler").open("wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
        except OSError:
            pass


@contextlib.contextmanager
def _tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``folder`` (the test skipped where none can be)."""
    folder.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or 'not root'})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs."""
    with _tmpfs(tmp_path / "disk", "1m") as disk:
        yield disk


@pytest.fixture
def full_disk(small_disk: Path) -> Path:
    """A 1 MiB tmpfs, filled to the last byte."""
    _fill(small_disk)
    return small_disk


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


# A process with metrics in a folder, which adds series once told the disk is full.
_METRICS_WRITER = """
import os, sys
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from sfbus import metrics
counter = metrics.counter("sfbus_test_series_total", "series", ("n",))
counter.labels("0").inc()
print("ready", flush=True)
sys.stdin.readline()
try:
    for n in range(1, 100_000):  # new series: the file grows past its first 64 KiB
        counter.labels(str(n)).inc()
except OSError as error:
    print("OSError", error.errno, flush=True)
"""


def test_metrics_on_a_disk_that_fills_fail_as_errors_not_sigbus(small_disk: Path) -> None:
    """prometheus_client maps its files and grows them sparse: a write into a page the full
    disk cannot allocate was a SIGBUS that killed the process; allocated first, it is an
    OSError (ENOSPC) where the metric is updated, which the kernel contains and counts."""
    writer = subprocess.Popen([sys.executable, "-c", _METRICS_WRITER, str(small_disk)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=SUM_DEMO.parents[1])
    assert writer.stdout.readline() == "ready\n"
    _fill(small_disk)
    out, _ = writer.communicate("go\n", timeout=60)
    assert writer.returncode == 0, f"exit {writer.returncode} (-7: SIGBUS); {out}"
    assert out.strip() == f"OSError {errno.ENOSPC}"


def _versions(folder: Path) -> list[int]:
    """The versions of the periodic checkpoints in ``folder``."""
    return sorted(int(p.stem.split("_")[1]) for p in folder.glob("checkpoint_*.pt"))


@contextlib.contextmanager
def _published_version(run_dir: Path) -> Iterator[Callable[[], int]]:
    """The version of policy 0's weights its learner published last, read from the run's
    shared memory: nothing in the run directory tells while its disk is full."""
    manifest = read_manifest(run_dir)
    counter = SharedArray.attach(manifest.run_id, manifest.array_specs()[version_name(0)])
    try:
        yield lambda: int(counter.numpy[0]) // 2  # PolicyWeights.version: even, twice it
    finally:
        counter.close()


# What each writer of the run directory reports when the full disk refuses it.
_REFUSED = ("learner.checkpoint raised OSError(28, 'No space left on device')",
            "stats: cannot append to progress.jsonl ([Errno 28] No space left on device)",
            "tensorboard: cannot write event files in")


@pytest.mark.timeout(180)
def test_training_goes_on_while_the_disk_is_full_and_checkpoints_fail(tmp_path: Path) -> None:
    """The run directory's disk fills mid-run until every writer met it and the learner
    trained 5 batches more: checkpoints, progress records and TensorBoard's scalars fail and
    are reported, no process dies (SIGBUS on its metrics files included), training goes on,
    and once space is back the run checkpoints again and, stopped, ends as an interrupted run
    (130)."""
    err_path = tmp_path / "stderr.txt"
    with _tmpfs(tmp_path / "disk", "64m") as disk, err_path.open("w") as err_file:
        checkpoints = disk / "run" / "checkpoints" / "policy_0"
        run = subprocess.Popen([sys.executable, "-m", "sfbus", "run", str(CARTPOLE),
                                "--run-dir", str(disk / "run"), "--max-seconds", "120",
                                "--set", "checkpoint_every_s=1", "--set", "keep_checkpoints=50"],
                               stdout=subprocess.DEVNULL, stderr=err_file, text=True)
        try:
            wait_for(lambda: _versions(checkpoints), 60, "a first checkpoint")
            with _published_version(disk / "run") as version:
                _fill(disk)
                filled, trained = max(_versions(checkpoints)), version()
                wait_for(lambda: version() >= trained + 5 and all(
                    refused in err_path.read_text() for refused in _REFUSED), 60,
                         "every writer to meet the full disk and 5 batches trained meanwhile")
            (disk / "filler").unlink()
            wait_for(lambda: max(_versions(checkpoints)) > filled, 30, "a checkpoint once freed")
            freed = max(_versions(checkpoints))
            run.send_signal(signal.SIGINT)
            run.wait(timeout=120)
        finally:
            run.kill()
    err = err_path.read_text()
    assert run.returncode == 130, err[-3000:]  # interrupted, its final checkpoint written
    assert "No space left on device" in err, err[-3000:]
    assert "restart" not in err and "signal" not in err, err[-3000:]
    # trained while full: versions went on rising (cartpole trains several batches a second)
    assert freed - filled >= 5, (filled, freed)
