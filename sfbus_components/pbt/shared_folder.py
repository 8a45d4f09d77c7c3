"""A population's shared folder: each member's record and checkpoint, written atomically.

A population across machines has no central process: each member is an ordinary run that
publishes to, and reads from, one folder every member can reach (NFS or any shared file system):

- ``<folder>/<member>/checkpoint_<version>.pt``: a copy of the member's newest learner checkpoint;
- ``<folder>/<member>/record.json``: a small :class:`MemberRecord` (frames, objective,
  hyperparameters, the checkpoint's file name, when it was written, a short history of
  (frames, objective) pairs).

Every write goes to a temporary file in the member's own folder, is fsynced, then renamed over
its name (``os.replace``: atomic within a directory on POSIX and on NFS), the checkpoint before
the record that names it: a reader sees the previous record or the new one, never a part, and
the checkpoint a record names is already whole. Old checkpoints are pruned keeping the newest
``keep_checkpoints`` (at least the one the record names and the one before, which a peer that
read the previous record may be copying). A reader skips (and counts) a record it cannot parse
and a member whose record is older than ``staleness_s`` by the reader's wall clock (a member
that stopped writing drops out; hosts keep their clocks in step, as NTP does).

A member ranks itself only against members at equal or fewer frames: each peer counts with the
newest entry of its history at or below the member's own frames (:func:`objective_at`); a peer
with none is left out, so a member that has trained longer never counts against one that has
not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sfbus_components.pbt.rules import Decision, PbtRules, decide

RECORD = "record.json"
_TEMP_PREFIX = ".tmp_"
_CHECKPOINT_PREFIX = "checkpoint_"


@dataclass(frozen=True)
class MemberRecord:
    """What a member publishes of itself (``record.json``)."""

    member: str
    """The member's name (its folder's name)."""
    frames: int
    """Env frames its policy has trained on."""
    objective: float | None
    """Its current objective (None: no finished episode yet)."""
    hyperparams: dict[str, float]
    """Its PBT-managed hyperparameters (``appo.lr``, ...)."""
    config: dict[str, Any]
    """Its learner's checkpoint fingerprint (env and model): only members with the same one can
    copy each other's checkpoints."""
    checkpoint: str | None = None
    """File name of its published checkpoint in its folder (None: none yet)."""
    version: int = 0
    """How many records the member has written (grows by one per write)."""
    written: float = 0.0
    """Wall-clock time of the write (``time.time()``)."""
    history: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    """(frames, objective) at its recent writes, oldest first."""

    def to_json(self) -> str:
        """The record as JSON text."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MemberRecord:
        """Parse a record; raises ``ValueError`` (or ``TypeError``/``KeyError``) for a bad one."""
        data = json.loads(text)
        objective = data["objective"]
        return cls(member=str(data["member"]), frames=int(data["frames"]),
                   objective=None if objective is None else float(objective),
                   hyperparams={str(k): float(v) for k, v in data["hyperparams"].items()},
                   config=dict(data["config"]),
                   checkpoint=None if data["checkpoint"] is None else str(data["checkpoint"]),
                   version=int(data["version"]), written=float(data["written"]),
                   history=tuple((int(f), float(o)) for f, o in data["history"]))


def objective_at(record: MemberRecord, frames: int) -> tuple[int, float] | None:
    """The newest (frames, objective) of ``record``'s history at or below ``frames`` (None:
    the member had no objective yet at that many frames)."""
    found = [entry for entry in record.history if entry[0] <= frames]
    return max(found) if found else None


@dataclass
class MemberDecision:
    """A member's update against its peers: the rules' decision, the peer it copies (if any)
    and the (frames, objective) of each peer it was ranked against."""

    decision: Decision
    source: MemberRecord | None
    compared: dict[str, tuple[int, float]]


def decide_member(member: str, frames: int, objective: float | None,
                  hyperparams: dict[str, float], peers: Mapping[str, MemberRecord],
                  config: Mapping[str, Any], rules: PbtRules, rng: np.random.Generator,
                  defaults: dict[str, float]) -> MemberDecision:
    """``member``'s update at ``frames`` with the in-run rules
    (:func:`~sfbus_components.pbt.rules.decide`), ranked against the ``peers`` with the same
    ``config`` and a published checkpoint that had an objective at ``frames`` or fewer, each with
    its newest such one. A peer's hyperparameters count only for the names this member has
    (others keep its own)."""
    compared = {name: at for name, record in peers.items()
                if record.config == config and record.checkpoint is not None
                and (at := objective_at(record, frames)) is not None}
    names = sorted({member, *compared})  # ids in name order: ties rank the same on every host
    ids = {name: i for i, name in enumerate(names)}
    objectives = {ids[name]: at[1] for name, at in compared.items()}
    if objective is not None:
        objectives[ids[member]] = objective
    values = {ids[name]: {k: peers[name].hyperparams.get(k, v) for k, v in hyperparams.items()}
              for name in compared}
    values[ids[member]] = dict(hyperparams)
    decision = decide(ids[member], frames, objectives, values, rules, rng, defaults=defaults)
    for name, i in ids.items():  # the rules name policies ("copies policy 2 (objective ...")
        decision.reason = decision.reason.replace(f"policy {i} ", f"member {name!r} ")
    source = None if decision.source is None else peers[names[decision.source]]
    return MemberDecision(decision, source, compared)


def add_to_history(history: tuple[tuple[int, float], ...], entry: tuple[int, float],
                   length: int) -> tuple[tuple[int, float], ...]:
    """``history`` with ``entry`` appended; past ``length`` entries the one whose neighbours are
    closest in frames is dropped (never the first or the newest), so a short history spans the
    whole run, evenly, for the peers that are far behind."""
    history = (*history, entry)
    if len(history) > max(length, 2):
        drop = min(range(1, len(history) - 1),
                   key=lambda i: history[i + 1][0] - history[i - 1][0])
        history = history[:drop] + history[drop + 1:]
    return history


def write_atomically(path: Path, write: Any) -> None:
    """Create ``path`` whole or not at all: ``write(file)`` fills a temporary file in the same
    folder, which is fsynced, renamed over ``path``, and the folder fsynced (the rename itself
    survives a crash)."""
    fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class SharedFolder:
    """One member's view of the population's folder: it writes its own subfolder, reads all."""

    def __init__(self, folder: str | Path, member: str, staleness_s: float,
                 keep_checkpoints: int = 2) -> None:
        if not member or "/" in member or member.startswith("."):
            raise ValueError(f"population member name {member!r}: need a plain folder name")
        self.folder = Path(folder)
        self.member = member
        self.own = self.folder / member
        self.staleness_s = staleness_s
        self.keep_checkpoints = max(2, keep_checkpoints)  # the record's and the one before
        self.unreadable = 0
        """Records skipped because they could not be parsed (counted over all reads)."""

    def read_own(self) -> MemberRecord | None:
        """This member's own record, whatever its age (a resumed member rejoins from it)."""
        return self._read(self.own / RECORD)

    def publish(self, record: MemberRecord, checkpoint: Path | None) -> MemberRecord:
        """Copy ``checkpoint`` in (unless a file of its name is there already), then write the
        record naming it; returns the record as written (``version``, ``written``,
        ``checkpoint`` set)."""
        self.own.mkdir(parents=True, exist_ok=True)
        for temp in self.own.glob(f"{_TEMP_PREFIX}*"):  # left by a write killed midway
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        name = record.checkpoint
        if checkpoint is not None:
            name = checkpoint.name  # the learner's checkpoint_<version>.pt: newer sorts later
            if not (self.own / name).exists():
                with checkpoint.open("rb") as source:
                    write_atomically(self.own / name,
                                     lambda out: shutil.copyfileobj(source, out, 1 << 20))
        written = MemberRecord(**{**asdict(record), "checkpoint": name,
                                  "version": record.version + 1, "written": time.time(),
                                  "history": record.history})
        write_atomically(self.own / RECORD, lambda out: out.write(written.to_json().encode()))
        self._prune(name)
        return written

    def peers(self) -> dict[str, MemberRecord]:
        """Every other member with a fresh, readable record, by name."""
        now = time.time()
        found = {}
        for path in sorted(self.folder.glob(f"*/{RECORD}")):
            if path.parent.name == self.member:
                continue
            record = self._read(path)
            if record is not None and record.member != path.parent.name:
                self.unreadable += 1  # a copied folder: its checkpoint is not where it says
            elif record is not None and now - record.written <= self.staleness_s:
                found[record.member] = record
        return found

    def checkpoint_of(self, record: MemberRecord) -> Path | None:
        """Where ``record``'s checkpoint lies (None: it names none)."""
        return None if record.checkpoint is None else self.folder / record.member / \
            record.checkpoint

    def _read(self, path: Path) -> MemberRecord | None:
        try:
            return MemberRecord.from_json(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            self.unreadable += 1
            return None

    def _prune(self, keep_name: str | None) -> None:
        files = sorted(self.own.glob(f"{_CHECKPOINT_PREFIX}*.pt"))
        for old in files[:-self.keep_checkpoints]:
            if old.name != keep_name:
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()
