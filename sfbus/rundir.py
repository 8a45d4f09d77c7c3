"""The run directory: its private layout, the manifest every process reads, the socket folder."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import msgspec

from sfbus.shm import ArraySpec

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

    def array_specs(self) -> dict[str, ArraySpec]:
        """The run's shared arrays by name."""
        return {a.name: ArraySpec(a.name, tuple(a.shape), a.dtype) for a in self.arrays}


def make_private_dir(path: str | Path) -> Path:
    """Create ``path`` (and parents) and make it readable by its owner only (0700)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def default_run_dir(topology_name: str) -> Path:
    """``runs/<topology>-<timestamp>`` under the current directory."""
    return Path("runs") / f"{topology_name}-{time.strftime('%Y%m%d-%H%M%S')}"


def choose_sock_dir(run_dir: Path, run_id: str) -> Path:
    """``run_dir/sock`` when its paths fit a Unix socket address, else a private temp folder."""
    candidate = run_dir.resolve() / "sock"
    if len(str(candidate)) > _MAX_SOCK_DIR:
        candidate = Path(tempfile.gettempdir()) / f"sfbus-{run_id}"
    return make_private_dir(candidate)


def write_manifest(run_dir: Path, manifest: Manifest) -> Path:
    """Write ``run.json`` atomically."""
    path = run_dir / "run.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(manifest))
    os.replace(tmp, path)
    return path


def read_manifest(run_dir: str | Path) -> Manifest:
    """Read ``run.json``."""
    return msgspec.json.decode(Path(run_dir, "run.json").read_bytes(), type=Manifest)


def remove_sock_dir(sock_dir: str | Path) -> None:
    """Remove the run's socket files (the whole folder)."""
    shutil.rmtree(sock_dir, ignore_errors=True)
