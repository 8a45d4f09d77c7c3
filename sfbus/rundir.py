"""The run directory: its private layout, the manifest every process reads, the socket folder."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from sfbus.errors import RunDirError
from sfbus.records import RunRecords
from sfbus.shm import ArraySpec
from sfbus.topology.yaml_source import dump_yaml

# Unix socket paths are limited to 107 bytes; leave room for "<process>.ipc".
_MAX_SOCK_DIR = 80


class ArrayEntry(msgspec.Struct, frozen=True):
    """One shared array of the run, as written in the manifest."""

    name: str
    shape: tuple[int, ...]
    dtype: str


class RunLimits(msgspec.Struct, frozen=True):
    """When the run ends by itself (``--max-frames``, ``--max-seconds``); None: no limit."""

    max_frames: int | None = None
    max_seconds: float | None = None


class Manifest(msgspec.Struct, frozen=True):
    """What a child process needs to join the run (``run.json`` in the run directory)."""

    run_id: str
    sock_dir: str
    topology_file: str
    arrays: tuple[ArrayEntry, ...]
    limits: RunLimits = RunLimits()
    records: dict[str, msgspec.Raw] = {}
    """The run records (:mod:`sfbus.records`) as JSON, by record type."""

    def array_specs(self) -> dict[str, ArraySpec]:
        """The run's shared arrays by name."""
        return {a.name: ArraySpec(a.name, tuple(a.shape), a.dtype) for a in self.arrays}

    def run_records(self) -> RunRecords:
        """The run records computed at launch."""
        return RunRecords({key: bytes(raw) for key, raw in self.records.items()})


def make_private_dir(path: str | Path) -> Path:
    """Create ``path`` (and parents) and make it readable by its owner only (0700)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def new_run_dir(topology_name: str, parent: Path = Path("runs")) -> Path:
    """Create ``runs/<topology>-<timestamp>`` (``-2``, ``-3``, ... when that one exists: two runs
    started in the same second get two directories; ``mkdir`` decides who gets which)."""
    try:
        make_private_dir(parent)
    except OSError as error:
        raise RunDirError(f"cannot create {parent}/ for the run directory: "
                          f"{error.strerror or error}; give --run-dir DIR") from None
    # a file name has 255 bytes at most: a long topology name is cut, the time kept
    stem = f"{topology_name.encode()[:200].decode(errors='ignore')}-" \
           f"{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        path = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        except OSError as error:
            raise RunDirError(f"cannot create the run directory {path}: "
                              f"{error.strerror or error}; give --run-dir DIR") from None
        return path
    raise RunDirError(f"{parent}: no free run directory name for {stem}")


def check_run_dir(path: Path, *, resume: bool) -> None:
    """Refuse a run directory that cannot be one (raises :class:`RunDirError`, nothing changed):
    ``--resume`` needs a run's directory; a new run needs a new or empty one."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise RunDirError(f"{path}: not a directory")
    is_run = (path / "run.json").is_file()
    if resume:
        if not is_run:
            raise RunDirError(f"--resume {path}: not a run directory (no run.json)")
    elif is_run:  # a new run there would replace the old one's snapshot and mix its files
        raise RunDirError(f"--run-dir {path}: holds a run already; continue it with --resume "
                          f"{path}, or choose a new directory")
    elif path.exists() and any(path.iterdir()):
        raise RunDirError(f"--run-dir {path}: the directory is not empty and holds no run; "
                          "choose a new or empty directory")
    try:
        make_private_dir(path)
    except OSError as error:
        raise RunDirError(f"cannot create the run directory {path}: "
                          f"{error.strerror or error}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunDirError(f"{path}: not writable")


class RunDirLock:
    """An exclusive ``flock`` on ``RUN_DIR/lock`` held for a run's life: a second run or a
    ``--resume`` of a directory in use is refused. The kernel drops the lock when the holder
    exits, however it exits (``kill -9`` included), so a stale lock cannot outlive its run."""

    def __init__(self, run_dir: Path) -> None:
        path = run_dir / "lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise RunDirError(f"cannot write the run directory {run_dir}: "
                              f"{error.strerror or error}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunDirError(f"{run_dir}: in use by another run (pid {holder})") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as error:  # a full disk: the run could write nothing else either
            os.close(fd)
            raise RunDirError(f"cannot write the run directory {run_dir}: "
                              f"{error.strerror or error}") from None
        self.fd = fd

    def release(self) -> None:
        """Give the lock up (also done by the kernel at exit)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def choose_sock_dir(run_dir: Path, run_id: str) -> Path:
    """``run_dir/sock`` when its paths fit a Unix socket address, else a new private folder with
    an unpredictable name in the temp directory (one another user cannot have planted)."""
    candidate = run_dir.resolve() / "sock"
    if len(str(candidate)) > _MAX_SOCK_DIR:
        return Path(tempfile.mkdtemp(prefix=f"sfbus-{run_id}-"))
    return make_private_dir(candidate)


def write_manifest(run_dir: Path, manifest: Manifest) -> Path:
    """Write ``run.json`` atomically."""
    path = run_dir / "run.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(manifest))
    os.replace(tmp, path)
    return path


def write_snapshot(run_dir: Path, document: dict) -> Path:
    """Write the merged topology every process of the run loads (``topology.yaml``)."""
    snapshot = run_dir / "topology.yaml"
    snapshot.write_text(dump_yaml(document))
    return snapshot


def append_history(run_dir: Path, event: str, overrides: Sequence[str]) -> None:
    """Add a line to ``history.jsonl``: when the run was started or resumed, and with which
    ``--set`` overrides (a resumed run keeps its own settings but these)."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event,
              "set": list(overrides)}
    with (run_dir / "history.jsonl").open("a") as file:
        file.write(json.dumps(record) + "\n")


def read_manifest(run_dir: str | Path) -> Manifest:
    """Read ``run.json``."""
    return msgspec.json.decode(Path(run_dir, "run.json").read_bytes(), type=Manifest)


def remove_sock_dir(sock_dir: str | Path) -> None:
    """Remove the run's socket files (the whole folder)."""
    shutil.rmtree(sock_dir, ignore_errors=True)
