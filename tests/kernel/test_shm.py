"""Shared arrays in /dev/shm: create, attach across processes, permissions, cleanup."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sfbus.errors import SharedMemoryError
from sfbus.shm import (
    ArraySpec,
    SharedArray,
    SharedMemory,
    liveness_lock_path,
    new_run_id,
    segment_path,
)
from sfbus.shm_cleanup import clean_stale_segments, remove_run_segments

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_id() -> Iterator[str]:
    """A fresh run id whose segments are all removed after the test, pass or fail."""
    rid = new_run_id()
    try:
        yield rid
    finally:
        remove_run_segments(rid)


def _dead_pid() -> int:
    # A reaped child's pid names no process (until the kernel reuses it, far later).
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _run_child(code: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr


def test_new_run_id_names_this_process() -> None:
    pid, token = new_run_id().split("-")
    assert int(pid) == os.getpid()
    assert len(token) == 8
    assert new_run_id() != new_run_id()


def test_child_process_sees_same_bytes_in_numpy_and_torch(run_id: str) -> None:
    specs = [ArraySpec("obs", (2, 3), "float32"), ArraySpec("done", (4,), "uint8")]
    with SharedMemory.create(run_id, specs) as shm:
        shm["obs"].numpy[:] = np.arange(6, dtype=np.float32).reshape(2, 3)
        _run_child(f"""
            import torch
            from sfbus.shm import ArraySpec, SharedMemory
            specs = [ArraySpec("obs", (2, 3), "float32"), ArraySpec("done", (4,), "uint8")]
            shm = SharedMemory.attach({run_id!r}, specs)
            obs = shm["obs"].torch
            assert obs.dtype == torch.float32 and obs.tolist() == [[0, 1, 2], [3, 4, 5]], obs
            assert shm["obs"].numpy.sum() == 15
            obs[1, 2] = -1.5  # through torch...
            shm["done"].numpy[3] = 7  # ...and through numpy
            shm.close()
        """)
        assert shm["obs"].numpy[1, 2] == -1.5
        assert shm["obs"].torch[1, 2].item() == -1.5
        assert shm["done"].numpy.tolist() == [0, 0, 0, 7]
        shm.unlink()


def test_numpy_and_torch_views_share_bytes(run_id: str) -> None:
    array = SharedArray.create(run_id, ArraySpec("x", (3,), "int64"))
    try:
        array.torch[1] = 42
        assert array.numpy.tolist() == [0, 42, 0]  # new segments are zero-filled
        assert array.numpy is array.numpy  # views are cached, not rebuilt per access
    finally:
        array.close()
        array.unlink()


def test_segment_is_private_to_its_user(run_id: str) -> None:
    old_umask = os.umask(0)  # a permissive umask must not widen the mode
    try:
        array = SharedArray.create(run_id, ArraySpec("x", (8,), "uint8"))
    finally:
        os.umask(old_umask)
    try:
        assert array.path == segment_path(run_id, "x") == f"/dev/shm/sfbus-{run_id}-x"
        assert stat.S_IMODE(os.stat(array.path).st_mode) == 0o600
    finally:
        array.close()
        array.unlink()


def test_create_of_existing_segment_fails(run_id: str) -> None:
    spec = ArraySpec("x", (8,), "uint8")
    first = SharedArray.create(run_id, spec)
    try:
        with pytest.raises(SharedMemoryError) as info:
            SharedArray.create(run_id, spec)
        assert str(info.value) == (
            f"shared-memory segment '/dev/shm/sfbus-{run_id}-x' already exists; another run uses"
            " this run id, or a crashed run left it behind (remove it with `sfbus clean`)"
        )
    finally:
        first.close()


def test_attach_with_wrong_size_names_the_segment(run_id: str) -> None:
    SharedArray.create(run_id, ArraySpec("x", (8,), "uint8")).close()
    with pytest.raises(SharedMemoryError) as info:
        SharedArray.attach(run_id, ArraySpec("x", (4,), "float32"))
    assert str(info.value) == (
        f"shared-memory segment '/dev/shm/sfbus-{run_id}-x' is 8 bytes, but spec x (4,) float32"
        " needs 16 bytes; the processes of this run disagree on its shape or dtype"
    )


def test_attach_of_missing_segment_names_it(run_id: str) -> None:
    with pytest.raises(SharedMemoryError) as info:
        SharedMemory.attach(run_id, [ArraySpec("x", (8,), "uint8")])
    assert str(info.value) == (
        f"shared-memory segment '/dev/shm/sfbus-{run_id}-x' does not exist: the launcher of run"
        f" {run_id} has not created it, or the run has ended"
    )


def test_unlink_removes_files_and_is_idempotent(run_id: str) -> None:
    specs = [ArraySpec("a", (2,), "int8"), ArraySpec("b.c-d", (2,), "bool")]
    shm = SharedMemory.create(run_id, specs)
    paths = [shm[name].path for name in shm]
    assert all(os.path.exists(path) for path in paths)
    shm.close()
    shm.unlink()
    assert not any(os.path.exists(path) for path in paths)
    shm.unlink()
    shm.close()


def test_create_is_all_or_none(run_id: str) -> None:
    SharedArray.create(run_id, ArraySpec("b", (2,), "int8")).close()  # in the way
    with pytest.raises(SharedMemoryError, match="already exists"):
        SharedMemory.create(run_id, [ArraySpec("a", (2,), "int8"), ArraySpec("b", (2,), "int8")])
    assert not os.path.exists(segment_path(run_id, "a"))


def test_duplicate_names_are_rejected(run_id: str) -> None:
    specs = [ArraySpec("a", (2,), "int8"), ArraySpec("a", (3,), "int8")]
    with pytest.raises(ValueError, match="shared array 'a' is declared twice"):
        SharedMemory.create(run_id, specs)
    assert not os.path.exists(segment_path(run_id, "a"))


def test_mapping_access(run_id: str) -> None:
    with SharedMemory.create(run_id, [ArraySpec("a", (2,), "int8")]) as shm:
        assert list(shm) == ["a"] and len(shm) == 1 and "a" in shm
        assert shm.specs == [ArraySpec("a", (2,), "int8")]
        with pytest.raises(KeyError, match="no shared array 'b'"):
            shm["b"]


def test_close_with_live_view_keeps_the_view_valid(run_id: str) -> None:
    array = SharedArray.create(run_id, ArraySpec("x", (4,), "float64"))
    view = array.numpy
    array.close()  # must not raise BufferError although `view` pins the mapping
    array.close()
    view[0] = 1.0
    assert view[0] == 1.0
    with pytest.raises(ValueError, match="is closed"):
        _ = array.numpy


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (("a/b", (1,), "int8"), "name 'a/b' is invalid"),
        (("a", (0,), "int8"), "shape (0,) must hold positive ints"),
        (("a", (2, -1), "int8"), "shape (2, -1) must hold positive ints"),
        (("a", (True,), "int8"), "shape (True,) must hold positive ints"),
        (("a", (1,), "float77"), "unknown dtype 'float77'"),
        (("a", (1,), "object"), "dtype 'object' cannot live in shared memory"),
        (("a", (1,), ">f4"), "dtype '>f4' cannot live in shared memory"),
    ],
)
def test_bad_specs_are_value_errors(spec: tuple, message: str) -> None:
    with pytest.raises(ValueError) as info:
        ArraySpec(*spec)
    assert message in str(info.value)


def test_spec_normalises_shape_and_dtype() -> None:
    spec = ArraySpec("a", [2, 3], "f4")  # type: ignore[arg-type]  # YAML gives lists
    assert spec == ArraySpec("a", (2, 3), "float32")
    assert spec.nbytes == 24


def test_bad_run_id_is_rejected() -> None:
    with pytest.raises(ValueError, match="run id 'exp-1-x' is not '<launcher pid>-<token>'"):
        segment_path("exp-1-x", "a")


def test_remove_run_segments_spares_other_runs(run_id: str) -> None:
    other = run_id + "f"  # same prefix: must not be caught by this run's pattern
    try:
        SharedArray.create(run_id, ArraySpec("a", (1,), "int8")).close()
        SharedArray.create(other, ArraySpec("a", (1,), "int8")).close()
        assert remove_run_segments(run_id) == [segment_path(run_id, "a")]
        assert os.path.exists(segment_path(other, "a"))
    finally:
        remove_run_segments(other)


def test_remove_run_segments_takes_the_runs_lock_file_too(run_id: str) -> None:
    shm = SharedMemory.create(run_id, [ArraySpec("a", (1,), "int8")])
    shm.close()  # a test or a crash that never unlinked
    assert os.path.exists(liveness_lock_path(run_id))
    assert remove_run_segments(run_id) == sorted([segment_path(run_id, "a"),
                                                  liveness_lock_path(run_id)])
    assert not os.path.exists(liveness_lock_path(run_id))


def test_clean_stale_segments_removes_dead_runs_only(run_id: str) -> None:
    dead_run = f"{_dead_pid()}-{run_id.split('-')[1]}"
    try:
        SharedArray.create(dead_run, ArraySpec("a", (1,), "int8")).close()
        SharedArray.create(run_id, ArraySpec("a", (1,), "int8")).close()  # our pid: alive
        removed = clean_stale_segments()
        assert segment_path(dead_run, "a") in removed
        assert not os.path.exists(segment_path(dead_run, "a"))
        assert os.path.exists(segment_path(run_id, "a"))
        assert segment_path(run_id, "a") not in removed
    finally:
        remove_run_segments(dead_run)


def test_a_run_whose_launcher_holds_its_lock_is_alive_whatever_its_pid(run_id: str) -> None:
    # A launcher in another PID namespace: its pid means nothing here, its lock does.
    foreign = f"{_dead_pid()}-{run_id.split('-')[1]}x"
    code = (f"import sys; from sfbus.shm import ArraySpec, SharedMemory; "
            f"m = SharedMemory.create({foreign!r}, [ArraySpec('a', (1,), 'int8')]); "
            "print('up', flush=True); sys.stdin.read(); m.unlink()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline() == "up\n"
        assert segment_path(foreign, "a") not in clean_stale_segments()
        assert os.path.exists(segment_path(foreign, "a"))
        holder.kill()  # no clean-up of its own: the kernel drops the lock
        holder.communicate(timeout=30)
        assert clean_stale_segments() == [segment_path(foreign, "a")]
        assert not os.path.exists(liveness_lock_path(foreign))
    finally:
        holder.kill()
        holder.communicate(timeout=30)
        remove_run_segments(foreign)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(liveness_lock_path(foreign))


def test_attach_refuses_a_symlink(run_id: str, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\0")
    os.symlink(target, segment_path(run_id, "a"))
    try:
        with pytest.raises(SharedMemoryError, match="it is a symbolic link"):
            SharedArray.attach(run_id, ArraySpec("a", (1,), "int8"))
    finally:
        os.unlink(segment_path(run_id, "a"))


def test_attach_refuses_another_users_segment(run_id: str) -> None:
    SharedArray.create(run_id, ArraySpec("a", (1,), "int8")).close()
    try:
        if os.getuid() == 0:
            os.chown(segment_path(run_id, "a"), 65534, 65534)  # nobody
        else:
            pytest.skip("needs root to give a file to another user")
        with pytest.raises(SharedMemoryError, match="belongs to uid 65534, not to this user"):
            SharedArray.attach(run_id, ArraySpec("a", (1,), "int8"))
    finally:
        remove_run_segments(run_id)
