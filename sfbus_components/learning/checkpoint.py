"""Learner checkpoints: atomic writes, the newest K kept, clear errors on a bad or foreign file.

A checkpoint is one ``torch.save`` of a plain dict (tensors, numbers, strings), written to a
temporary file in the target folder, fsynced, then renamed over ``checkpoint_<step:09d>.pt``: a
crash mid-write leaves the previous checkpoint as it was. Loading uses ``weights_only=True``, so a
checkpoint can never run code. Tensors are saved on the CPU (``TrainingState.state_dict``) and
loaded onto the device the caller names, so a checkpoint does not depend on where it was trained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from sfbus import SfbusError, make_private_dir

_NAME = re.compile(r"^checkpoint_(\d+)\.pt$")
_TEMP_PREFIX = ".checkpoint_"
_TEMP_SUFFIX = ".tmp"
REQUIRED_KEYS = ("policy", "optimizer", "version", "env_frames", "train_steps", "samples",
                 "config")


class CheckpointError(SfbusError):
    """A checkpoint cannot be used: the file is corrupt or truncated, or was saved by a run with
    a different environment or model. Not a bug: delete the file (the previous one is then used)
    or resume with the settings it was saved with."""


class UnreadableCheckpoint(CheckpointError):
    """The file cannot be read as a checkpoint (truncated, corrupt); older ones may still be."""


def config_fingerprint(env: str, model: Any) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the environment name and the model config
    (a dataclass), as plain JSON values so a loaded one compares equal."""
    return json.loads(json.dumps({"env": env, "model": dataclasses.asdict(model)}))


def checkpoint_path(directory: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives in ``directory``."""
    return Path(directory) / f"checkpoint_{step:09d}.pt"


def list_checkpoints(directory: str | Path) -> list[Path]:
    """The checkpoints in ``directory``, oldest step first (none if it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint with the highest step in ``directory``, or None."""
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def save_checkpoint(directory: str | Path, state: Mapping[str, Any], step: int, keep: int) -> Path:
    """Write ``state`` atomically as the checkpoint of ``step``; keep only the newest ``keep``."""
    directory = make_private_dir(directory)
    _remove_stale_temps(directory)  # left by a process killed mid-write
    fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(dict(state), file)
            file.flush()
            os.fsync(file.fileno())
        path = checkpoint_path(directory, step)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _fsync_dir(directory)  # make the rename itself survive a power loss
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        with contextlib.suppress(FileNotFoundError):  # a concurrent save may have pruned it
            old.unlink()
    return path


def load_checkpoint(path: str | Path, config: Mapping[str, Any] | None = None,
                    required: Sequence[str] = REQUIRED_KEYS, kind: str = "learner",
                    map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint, its tensors onto ``map_location``; with ``config``, also check it was
    saved with that fingerprint.

    ``required``: the keys a ``kind`` checkpoint holds (a learner's by default).

    Raises :class:`CheckpointError` for an unreadable file or a mismatched configuration.
    """
    path = Path(path)
    try:
        state = torch.load(path, weights_only=True, map_location=map_location)
    except Exception as error:
        raise UnreadableCheckpoint(
            f"{path}: cannot read checkpoint (corrupt or truncated file); delete it to resume "
            f"from the previous checkpoint") from error
    if not isinstance(state, dict) or (missing := [k for k in required if k not in state]):
        what = f"missing {', '.join(missing)}" if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path}: not a {kind} checkpoint ({what})")
    if config is not None:
        check_config(path, dict(config), state["config"])
    return state


def load_newest(directory: str | Path, config: Mapping[str, Any] | None = None,
                required: Sequence[str] = REQUIRED_KEYS, kind: str = "learner",
                log: logging.Logger | None = None, map_location: str | torch.device = "cpu",
                ) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint in ``directory`` that can be read, and its state, its tensors on
    ``map_location`` (None: there is none). A truncated or corrupt newer one is skipped with a
    warning, so a resume falls back to the one before; when none can be read,
    :class:`CheckpointError` names them all. A configuration mismatch is never skipped (see
    :func:`load_checkpoint`)."""
    unreadable = []
    for path in reversed(list_checkpoints(directory)):
        try:
            state = load_checkpoint(path, config, required, kind, map_location)
        except UnreadableCheckpoint:
            unreadable.append(path.name)
            continue
        if unreadable and log is not None:
            log.warning("skipped unreadable %s checkpoint(s) %s (truncated or corrupt); "
                        "resuming from %s", kind, ", ".join(unreadable), path)
        return path, state
    if unreadable:
        raise CheckpointError(f"{directory}: no readable {kind} checkpoint (all of "
                              f"{', '.join(unreadable)} are truncated or corrupt)")
    return None


def check_config(path: str | Path, expected: dict[str, Any], found: Any) -> None:
    """Raise :class:`CheckpointError` listing each key where ``found`` differs from ``expected``."""
    if found == expected:
        return
    mine, theirs = _flatten(expected), _flatten(found if isinstance(found, dict) else {})
    diffs = [f"{key}: checkpoint {theirs.get(key)!r}, this run {mine.get(key)!r}"
             for key in sorted(mine.keys() | theirs.keys()) if mine.get(key) != theirs.get(key)]
    raise CheckpointError(
        f"{path}: saved with a different configuration ({'; '.join(diffs)}); resume with the "
        f"settings it was saved with, or start a new run directory")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _remove_stale_temps(directory: Path) -> None:
    for temp in directory.glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
