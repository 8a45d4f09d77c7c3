"""The league's append-only snapshot store in the run directory: ``RUN_DIR/league/``.

A snapshot is one policy's published weights vector (model and observation normalizer, the
layout of :class:`sfbus_components.datapath.buffers.PolicyWeights`) at one version, saved as
``snapshot_<id:06d>.pt``; ``snapshots.jsonl`` lists them, one JSON line each (``snapshot``,
``policy``, ``version``, ``env_frames``, ``file``, ``reason``, ``time``). The file is written to
a temporary name, fsynced and renamed before its line is appended and fsynced, so a line always
names a whole file; a reader skips a torn last line (a crash mid-append) and a line whose file
is gone. Nothing is ever rewritten or removed: a resumed run reads the same store.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

INDEX = "snapshots.jsonl"


@dataclass(frozen=True)
class Snapshot:
    """One entry of the store."""

    snapshot: int
    """Its id: its line's position in the index, from 0 (a lost file leaves its id unused)."""
    policy: int
    version: int
    """The policy's weights version it froze."""
    env_frames: int
    """The policy's trained env frames at that version."""
    file: str
    """The weights file, relative to the store's folder."""
    reason: str
    """Why it was taken: ``first``, ``frames`` (every K frames) or ``win_rate``."""
    time: float


def snapshot_weights(path: str | Path) -> torch.Tensor:
    """The weights vector a snapshot file holds (``KeyError``: the file is no snapshot)."""
    return torch.load(path, weights_only=True)["weights"]


def load_opponent(path: str | Path, policy: Any) -> None:
    """Load a fixed opponent into ``policy`` (a fresh ``Policy`` of the run's env and model): a
    league snapshot (its published weights vector) or a learner checkpoint (its ``policy``
    state); ``ValueError`` saying why when the file is neither, unreadable or of another model."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:
        raise ValueError(f"cannot read it ({type(error).__name__}: {error})") from None
    tensors = policy.published_tensors()
    size = sum(t.numel() for t in tensors)
    if isinstance(state, dict) and isinstance(state.get("weights"), torch.Tensor):
        weights = state["weights"]
        if weights.numel() != size:
            raise ValueError(f"a snapshot of {weights.numel()} weights; this run's model has "
                             f"{size} (another model?)")
        with torch.no_grad():
            offset = 0
            for tensor in tensors:  # the published order: parameters, then buffers
                tensor.copy_(weights[offset:offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
    elif isinstance(state, dict) and isinstance(state.get("policy"), dict):
        try:
            policy.load_state_dict(state["policy"])
        except RuntimeError as error:
            raise ValueError(f"does not fit this run's model "
                             f"({str(error).splitlines()[0]})") from None
    else:
        raise ValueError("neither a league snapshot nor a learner checkpoint")


class SnapshotStore:
    """The snapshots of ``folder``, read at construction and appended to by :meth:`add`."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.snapshots: list[Snapshot] = []
        """The readable snapshots, oldest first."""
        self.by_id: dict[int, Snapshot] = {}
        self.next_id = 0
        """The next snapshot's id: one past every id listed, so no file name is used twice."""
        index = self.folder / INDEX
        if not index.exists():
            return
        for temp in self.folder.glob(".snapshot_*.tmp"):  # left by a writer killed mid-write
            temp.unlink(missing_ok=True)
        text = index.read_text()
        if text and not text.endswith("\n"):  # a torn last line: end it, so the next is whole
            with index.open("a") as out:
                out.write("\n")
        for line in text.splitlines():
            try:
                snapshot = Snapshot(**json.loads(line))
            except (ValueError, TypeError):  # a torn last line: its file was never listed
                continue
            self.next_id = max(self.next_id, snapshot.snapshot + 1)
            if (self.folder / snapshot.file).exists():
                self.snapshots.append(snapshot)
                self.by_id[snapshot.snapshot] = snapshot

    def __len__(self) -> int:
        return len(self.snapshots)

    def add(self, policy: int, version: int, env_frames: int, weights: torch.Tensor,
            reason: str) -> Snapshot:
        """Write ``weights`` as the next snapshot, then list it; returns its entry."""
        self.folder.mkdir(parents=True, exist_ok=True)
        snapshot = Snapshot(self.next_id, policy, version, env_frames,
                            f"snapshot_{self.next_id:06d}.pt", reason, round(time.time(), 3))
        fd, temp = tempfile.mkstemp(prefix=".snapshot_", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as file:
                torch.save({"weights": weights.detach().cpu().clone(), **asdict(snapshot)}, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, self.folder / snapshot.file)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        with (self.folder / INDEX).open("a") as index:
            index.write(json.dumps(asdict(snapshot)) + "\n")
            index.flush()
            os.fsync(index.fileno())
        self.snapshots.append(snapshot)
        self.by_id[snapshot.snapshot] = snapshot
        self.next_id += 1
        return snapshot

    def weights(self, snapshot: int) -> torch.Tensor:
        """The weights vector of snapshot ``snapshot``."""
        return snapshot_weights(self.folder / self.by_id[snapshot].file)

    def newest(self, policy: int) -> Snapshot | None:
        """The newest snapshot of ``policy``, or None."""
        return next((s for s in reversed(self.snapshots) if s.policy == policy), None)
