"""Names of a run's shared memory: array specs, run ids and the segment files they name.

A segment is the file ``/dev/shm/sfbus-{run_id}-{array_name}``; ``run_id`` is
``{launcher_pid}-{token}``, and ``/dev/shm/sfbus-{run_id}.lock`` is the lock its launcher holds
while the run lives. :mod:`sfbus.shm` maps the segments; :mod:`sfbus.shm_cleanup` finds those of
dead runs by these names.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass

import numpy as np

SHM_DIR = "/dev/shm"
"""Where segments live: a tmpfs on Linux, so a segment is RAM that outlives its processes."""

_PREFIX = "sfbus-"
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
# The token has no '-', so the prefix "sfbus-{run_id}-" of one run never matches another run's.
_RUN_ID_RE = re.compile(r"([0-9]+)-([A-Za-z0-9_]+)")
# Kinds that map onto raw bytes: bool, signed/unsigned int, float, complex.
_DTYPE_KINDS = "biufc"
_MAX_FILENAME = 255


@dataclass(frozen=True)
class ArraySpec:
    """The name, shape and numpy dtype of one shared array; invalid specs raise ``ValueError``."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ValueError(
                f"shared array name {self.name!r} is invalid: "
                "use only letters, digits, '_', '.', '-'"
            )
        # Topology YAML gives lists; store a tuple so specs stay hashable and comparable.
        try:
            shape = tuple(self.shape)
        except TypeError:
            raise ValueError(
                f"shared array {self.name!r}: shape {self.shape!r} is not a sequence of ints"
            ) from None
        for dim in shape:
            if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
                raise ValueError(
                    f"shared array {self.name!r}: shape {self.shape!r} must hold positive ints"
                )
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        try:
            # np.dtype(None) is float64; a missing dtype is a mistake, not a request for floats.
            if self.dtype is None:
                raise TypeError
            dtype = np.dtype(self.dtype)
        except TypeError:
            raise ValueError(
                f"shared array {self.name!r}: unknown dtype {self.dtype!r}"
                " (use a numpy dtype string such as 'float32', 'uint8', 'int64')"
            ) from None
        if dtype.kind not in _DTYPE_KINDS or dtype.byteorder not in "=|":
            raise ValueError(
                f"shared array {self.name!r}: dtype {self.dtype!r} cannot live in shared memory"
                " (use a native-endian bool, integer, float or complex dtype)"
            )
        # Store the canonical name so that "f4" and "float32" give equal specs.
        object.__setattr__(self, "dtype", dtype.name)

    @property
    def nbytes(self) -> int:
        """Size of the array in bytes."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def new_run_id() -> str:
    """Return a fresh run id ``{pid}-{token}`` for a launcher running in this process."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def _check_run_id(run_id: str) -> None:
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise ValueError(
            f"run id {run_id!r} is not '<launcher pid>-<token>'; make one with"
            " sfbus.shm.new_run_id()"
        )


def segment_path(run_id: str, name: str) -> str:
    """Return the ``/dev/shm`` path of array ``name`` in run ``run_id``."""
    _check_run_id(run_id)
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"shared array name {name!r} is invalid")
    filename = f"{_PREFIX}{run_id}-{name}"
    if len(filename) > _MAX_FILENAME:
        raise ValueError(f"shared-memory segment name {filename!r} is longer than 255 characters")
    return os.path.join(SHM_DIR, filename)


def liveness_lock_path(run_id: str) -> str:
    """The lock file its launcher holds (``flock``) for as long as run ``run_id`` lives: the
    kernel drops the lock when the launcher exits however it exits, so ``sfbus clean`` can tell
    a dead run from a live one even in another PID namespace sharing /dev/shm."""
    _check_run_id(run_id)
    return os.path.join(SHM_DIR, f"{_PREFIX}{run_id}.lock")


def _list_shm() -> list[str]:
    try:
        return os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
