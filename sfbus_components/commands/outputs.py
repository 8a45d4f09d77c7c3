"""Checks that a command's output can be written, made before any work: bad input, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

from sfbus import BadInput


def check_writable_file(path: Path, flag: str, make_folder: bool = True) -> None:
    """``path`` can be written (its folder made if missing and ``make_folder``), and is left as
    it was (a probe file this creates is removed)."""
    if path.is_dir():
        raise BadInput(f"{flag} {path}: is a directory")
    if not make_folder and not path.parent.is_dir():
        raise BadInput(f"{flag} {path}: no such directory {path.parent}")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab"):
            pass
    except OSError as error:
        raise BadInput(f"{flag} {path}: cannot write it: {error.strerror or error}") from None
    if not existed:
        path.unlink(missing_ok=True)


def check_writable_dir(path: Path, flag: str, what: str = "files") -> None:
    """``path`` is (or can be made) a folder to write ``what`` into; made now."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".sfbus-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise BadInput(f"{flag} {path}: cannot write {what} there: "
                       f"{error.strerror or error}") from None
