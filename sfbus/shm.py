"""Named, fixed-shape shared arrays in ``/dev/shm``, and the removal of a run's segments.

The launcher creates every array of a run once from its specs; each process attaches them by name,
so a restarted process finds the same bytes. A segment is a plain file
``/dev/shm/sfbus-{run_id}-{array_name}`` (:mod:`sfbus.shm_names`) mapped with ``mmap``; ``run_id``
is ``{launcher_pid}-{token}``, which lets :func:`sfbus.shm_cleanup.clean_stale_segments` tell the
segments of a dead launcher from those of a live one.

We do not use :mod:`multiprocessing.shared_memory`: its resource tracker unlinks a segment when the
process that touched it exits, which would delete the buffers a restarted process must reattach.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Self

import numpy as np

from sfbus.errors import SharedMemoryError
from sfbus.shm_names import (
    SHM_DIR,
    ArraySpec,
    liveness_lock_path,
    new_run_id,
    segment_path,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "SHM_DIR",
    "ArraySpec",
    "SharedArray",
    "SharedMemory",
    "liveness_lock_path",
    "new_run_id",
    "segment_path",
]

logger = logging.getLogger(__name__)

class SharedArray:
    """One shared-memory segment seen as a numpy array and a torch tensor over the same bytes.

    Made with :meth:`create` (launcher) or :meth:`attach` (every process); usable from any thread
    of the process that made it. A new segment is zero-filled; callers write their own sentinels.
    """

    def __init__(self, path: str, spec: ArraySpec, mm: mmap.mmap) -> None:
        """Wrap an existing mapping; use :meth:`create` or :meth:`attach` instead."""
        self._path = path
        self._spec = spec
        self._mmap: mmap.mmap | None = mm
        self._numpy: np.ndarray | None = None
        self._torch: torch.Tensor | None = None

    @classmethod
    def create(cls, run_id: str, spec: ArraySpec) -> SharedArray:
        """Create a zero-filled segment for ``spec``; raise SharedMemoryError if it exists."""
        path = segment_path(run_id, spec.name)
        nbytes = spec.nbytes
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            raise SharedMemoryError(
                f"shared-memory segment '{path}' already exists; another run uses this run id,"
                " or a crashed run left it behind (remove it with `sfbus clean`)"
            ) from None
        except OSError as exc:
            raise SharedMemoryError(
                f"cannot create shared-memory segment '{path}': {exc.strerror}"
            ) from exc
        try:
            # The umask may have cleared bits of 0o600; set them exactly.
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, nbytes)
            _reserve(fd, path, nbytes)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException as exc:
            os.close(fd)
            _unlink_quietly(path)
            if isinstance(exc, OSError):
                raise SharedMemoryError(
                    f"cannot create shared-memory segment '{path}' ({nbytes} bytes):"
                    f" {exc.strerror or exc}"
                ) from exc
            raise
        os.close(fd)  # the mapping keeps its own reference to the file
        return cls(path, spec, mm)

    @classmethod
    def attach(cls, run_id: str, spec: ArraySpec) -> SharedArray:
        """Map the existing segment for ``spec``; raise SharedMemoryError if missing or resized."""
        path = segment_path(run_id, spec.name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SharedMemoryError(
                f"shared-memory segment '{path}' does not exist: the launcher of run {run_id}"
                " has not created it, or the run has ended"
            ) from None
        except OSError as exc:
            reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise SharedMemoryError(
                f"cannot open shared-memory segment '{path}': {reason}"
            ) from exc
        try:
            info = os.fstat(fd)
            if info.st_uid != os.getuid():  # planted by another user in the shared /dev/shm
                raise SharedMemoryError(f"shared-memory segment '{path}' belongs to uid "
                                        f"{info.st_uid}, not to this user; refusing to map it")
            size = info.st_size
            if size != spec.nbytes:
                raise SharedMemoryError(
                    f"shared-memory segment '{path}' is {size} bytes, but spec"
                    f" {spec.name} {spec.shape} {spec.dtype} needs {spec.nbytes} bytes;"
                    " the processes of this run disagree on its shape or dtype"
                )
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise SharedMemoryError(
                f"cannot map shared-memory segment '{path}': {exc.strerror or exc}"
            ) from exc
        finally:
            os.close(fd)
        return cls(path, spec, mm)

    @property
    def spec(self) -> ArraySpec:
        """The spec this segment was created or attached with."""
        return self._spec

    @property
    def path(self) -> str:
        """The segment's file path in ``/dev/shm``."""
        return self._path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._mmap is None

    @property
    def numpy(self) -> np.ndarray:
        """A writable numpy view over the segment (no copy); raises ValueError once closed."""
        if self._numpy is None:
            if self._mmap is None:
                raise ValueError(f"shared array {self._spec.name!r} ('{self._path}') is closed")
            # frombuffer keeps a buffer export on the mmap, so close() cannot unmap pages under a
            # live view (np.ndarray(buffer=mm) keeps none, and a later access would segfault).
            flat = np.frombuffer(self._mmap, dtype=self._spec.dtype)
            self._numpy = flat.reshape(self._spec.shape)
        return self._numpy

    @property
    def torch(self) -> torch.Tensor:
        """A CPU torch tensor over the same bytes as :attr:`numpy`; imports torch on first use."""
        if self._torch is None:
            # Imported here so that processes which never touch tensors skip torch's import time.
            import torch

            self._torch = torch.from_numpy(self.numpy)
        return self._torch

    def close(self) -> None:
        """Drop this process's mapping; idempotent. The segment itself stays (see unlink)."""
        mm, self._mmap = self._mmap, None
        self._numpy = None
        self._torch = None
        if mm is None:
            return
        # A caller may still hold a view; the pages are unmapped when its last view is freed.
        with contextlib.suppress(BufferError):
            mm.close()

    def unlink(self) -> None:
        """Remove the segment's file; idempotent. Existing mappings stay valid until closed."""
        _unlink_quietly(self._path)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<SharedArray {self._spec.name} {self._spec.shape} {self._spec.dtype} {state}>"


class SharedMemory(Mapping[str, SharedArray]):
    """The set of shared arrays of one run, looked up by name: ``shm["traj.obs"].numpy``.

    The launcher calls :meth:`create` once per run and :meth:`unlink` on every exit path; every
    process (the launcher included) calls :meth:`attach` or uses the created object.
    """

    def __init__(self, run_id: str, arrays: dict[str, SharedArray],
                 liveness: int | None = None) -> None:
        """Wrap arrays already mapped; use :meth:`create` or :meth:`attach` instead."""
        self._run_id = run_id
        self._arrays = arrays
        self._liveness = liveness  # the creator's flock: while held, the run is alive

    @classmethod
    def create(cls, run_id: str, specs: Iterable[ArraySpec]) -> SharedMemory:
        """Create every array of ``specs``, all or none; raise SharedMemoryError on failure."""
        specs = _unique(specs)
        arrays: dict[str, SharedArray] = {}
        liveness = _hold_liveness_lock(run_id)
        try:
            for spec in specs:
                arrays[spec.name] = SharedArray.create(run_id, spec)
        except BaseException:
            for array in arrays.values():
                array.close()
                array.unlink()
            _release_liveness_lock(run_id, liveness)
            raise
        return cls(run_id, arrays, liveness)

    @classmethod
    def attach(cls, run_id: str, specs: Iterable[ArraySpec]) -> SharedMemory:
        """Attach every array of ``specs``; raise SharedMemoryError naming a missing segment."""
        specs = _unique(specs)
        arrays: dict[str, SharedArray] = {}
        try:
            for spec in specs:
                arrays[spec.name] = SharedArray.attach(run_id, spec)
        except BaseException:
            for array in arrays.values():
                array.close()
            raise
        return cls(run_id, arrays)

    @property
    def run_id(self) -> str:
        """The run these arrays belong to."""
        return self._run_id

    @property
    def specs(self) -> list[ArraySpec]:
        """The specs of every array, in creation order."""
        return [array.spec for array in self._arrays.values()]

    def __getitem__(self, name: str) -> SharedArray:
        try:
            return self._arrays[name]
        except KeyError:
            known = ", ".join(sorted(self._arrays)) or "none"
            raise KeyError(
                f"no shared array {name!r} in run {self._run_id} (have: {known})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def close(self) -> None:
        """Drop this process's mappings of every array; idempotent."""
        for array in self._arrays.values():
            array.close()

    def unlink(self) -> None:
        """Remove every array's file (and, for the creator, the run's liveness lock);
        idempotent, ignores files already gone."""
        for array in self._arrays.values():
            array.unlink()
        if self._liveness is not None:
            _release_liveness_lock(self._run_id, self._liveness)
            self._liveness = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SharedMemory run={self._run_id} arrays={list(self._arrays)}>"


def _hold_liveness_lock(run_id: str) -> int:
    path = liveness_lock_path(run_id)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _release_liveness_lock(run_id: str, fd: int) -> None:
    _unlink_quietly(liveness_lock_path(run_id))
    os.close(fd)


def _reserve(fd: int, path: str, nbytes: int) -> None:
    # tmpfs allocates pages lazily: without reserving them, a full /dev/shm (docker's default is
    # 64 MiB) shows up later as SIGBUS deep inside training instead of a clear error here.
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return  # this filesystem cannot reserve; fall back to lazy allocation
        if exc.errno == errno.ENOSPC:
            free = shutil.disk_usage(SHM_DIR).free
            raise SharedMemoryError(
                f"cannot create shared-memory segment '{path}' ({nbytes} bytes): {SHM_DIR} has"
                f" only {free} bytes free; enlarge it (docker: --shm-size) or use smaller buffers"
            ) from None
        raise


def _unlink_quietly(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _unique(specs: Iterable[ArraySpec]) -> list[ArraySpec]:
    specs = list(specs)
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"shared array {spec.name!r} is declared twice")
        seen.add(spec.name)
    return specs
