"""Removing a run's shared-memory segments: its own at its end, and those of runs that died.

A run is alive while its launcher holds the ``flock`` on its liveness lock file
(:func:`sfbus.shm.liveness_lock_path`); the kernel drops it when the launcher exits, however it
exits. That proves a run dead where its launcher's pid cannot: the pid may live in another PID
namespace that shares /dev/shm, or have been reused. Only this user's files are touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os

from sfbus.shm_names import (
    _PREFIX,
    _RUN_ID_RE,
    SHM_DIR,
    _check_run_id,
    _list_shm,
    liveness_lock_path,
)

logger = logging.getLogger(__name__)


def remove_run_segments(run_id: str) -> list[str]:
    """Remove every segment of run ``run_id`` and its liveness lock file; return the removed
    paths. For a run that is over: its launcher's lock is dropped with the file."""
    _check_run_id(run_id)
    prefix = f"{_PREFIX}{run_id}-"
    lock = os.path.basename(liveness_lock_path(run_id))
    removed = []
    for filename in sorted(_list_shm()):
        if filename.startswith(prefix) or filename == lock:
            path = os.path.join(SHM_DIR, filename)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
    return removed


def clean_stale_segments() -> list[str]:
    """Remove this user's segments of runs that provably ended; return the removed paths.

    A run whose liveness lock is held is alive; one whose lock can be taken, or that has no lock
    file and whose launcher pid does not exist (a run of an older sfbus), is dead. Anything else
    (another user's files, a pid that exists) is left alone: keeping a little memory is better
    than deleting a live run's buffers.
    """
    uid = os.getuid()
    runs: dict[str, list[str]] = {}
    for filename in sorted(_list_shm()):
        if not filename.startswith(_PREFIX):
            continue
        lock = filename.endswith(".lock")
        run_id = (filename[len(_PREFIX):-len(".lock")] if lock
                  else _run_id_of(filename[len(_PREFIX):]))
        if run_id is None or not _RUN_ID_RE.fullmatch(run_id):
            continue
        path = os.path.join(SHM_DIR, filename)
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(path).st_uid == uid:
                runs.setdefault(run_id, []).extend([] if lock else [path])
    removed = []
    for run_id, paths in runs.items():
        with _claim_if_dead(run_id) as dead:
            if not dead:
                continue
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed.append(path)
    if removed:
        logger.info("removed %d stale shared-memory segment(s) of dead runs", len(removed))
    return removed


def _run_id_of(rest: str) -> str | None:
    """``<pid>-<token>`` from ``<pid>-<token>-<array>``, or None for a name we did not make."""
    pid, _, tail = rest.partition("-")
    token = tail.partition("-")[0]
    run_id = f"{pid}-{token}"
    return run_id if _RUN_ID_RE.fullmatch(run_id) and tail.count("-") >= 1 else None


@contextlib.contextmanager
def _claim_if_dead(run_id: str):
    """Yields whether run ``run_id`` is dead, holding its lock meanwhile (so a cleaner racing
    another cleaner, or a run that is starting, never sees the same run dead twice)."""
    lock = liveness_lock_path(run_id)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        yield not _pid_alive(int(run_id.partition("-")[0]))
        return
    except OSError:  # a symlink, another user's: not ours to judge
        yield False
        return
    try:
        if os.fstat(fd).st_uid != os.getuid():
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False  # its launcher holds it: alive, wherever its pid lives
            return
        yield True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    # pid 0 and negative pids name process groups for os.kill, not a launcher: call them alive so
    # a name we did not make is left alone.
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists but belongs to another user
    except OverflowError:
        return False  # larger than any pid the kernel can give out
    return True
