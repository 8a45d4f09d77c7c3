"""The population's shared folder without runs: ranking only against members at equal or fewer
frames, staleness, unreadable records, and several processes writing and reading at once."""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from sfbus_components.pbt.rules import PbtRules
from sfbus_components.pbt.shared_folder import (
    RECORD,
    MemberRecord,
    SharedFolder,
    add_to_history,
    decide_member,
    objective_at,
)

CONFIG = {"env": "gym:CartPole-v1", "model": {"mlp_layers": [64, 64]}}
HP = {"appo.lr": 1e-3, "appo.entropy_coeff": 0.003}
# Two members: the worse one is in the worst half and copies the better one, no mutation drawn.
RULES = PbtRules(interval=1000, replace_fraction=0.5, mutation_rate=0.0)


def record(member: str, history: list[tuple[int, float]], config: dict = CONFIG,
           checkpoint: str | None = "checkpoint_000000001.pt",
           **hyperparams: float) -> MemberRecord:
    """A record whose history is ``history`` (its last entry: its frames and objective)."""
    frames, objective = history[-1] if history else (0, None)
    return MemberRecord(member, frames, objective, {**HP, **hyperparams}, config, checkpoint,
                        history=tuple(history), written=time.time())


def decide_b(peers: dict[str, MemberRecord], frames: int = 3000, objective: float = 10.0):
    """Member ``b``'s update at ``frames`` with ``objective`` against ``peers``."""
    return decide_member("b", frames, objective, dict(HP), peers, CONFIG, RULES,
                         np.random.default_rng(0), dict(HP))


def test_objective_at_is_the_newest_entry_at_or_below_the_frames() -> None:
    peer = record("a", [(1000, 5.0), (2000, 7.0), (4000, 50.0)])
    assert objective_at(peer, 3999) == (2000, 7.0)
    assert objective_at(peer, 4000) == (4000, 50.0)
    assert objective_at(peer, 999) is None


def test_a_member_ahead_in_frames_counts_only_with_what_it_had_at_equal_or_fewer_frames() -> None:
    # a is far better, but only at 5000 frames: b at 3000 has nobody to compare with
    ahead = record("a", [(5000, 100.0)], **{"appo.lr": 5e-4})
    alone = decide_b({"a": ahead})
    assert alone.decision.rank is None and alone.compared == {} and alone.source is None

    # at 2000 frames a was worse than b is at 3000: b is the best of two and keeps its own
    ahead = record("a", [(2000, 4.0), (5000, 100.0)], **{"appo.lr": 5e-4})
    kept = decide_b({"a": ahead})
    assert kept.compared == {"a": (2000, 4.0)}
    assert kept.decision.rank == 1 and kept.source is None
    assert kept.decision.hyperparams == HP

    # at 3000 frames a was better: b copies a's checkpoint and hyperparameters
    ahead = record("a", [(2000, 4.0), (3000, 20.0), (5000, 100.0)], **{"appo.lr": 5e-4})
    copied = decide_b({"a": ahead})
    assert copied.compared == {"a": (3000, 20.0)}
    assert copied.source is ahead and copied.decision.rank == 0
    assert copied.decision.hyperparams == {**HP, "appo.lr": 5e-4}
    assert "copies member 'a' (objective 20" in copied.decision.reason


def test_a_member_with_another_env_or_model_or_no_checkpoint_yet_is_left_out() -> None:
    assert decide_b({"a": record("a", [(1000, 50.0)])}).compared == {"a": (1000, 50.0)}
    other = record("a", [(1000, 50.0)], config={**CONFIG, "env": "gym:Acrobot-v1"})
    assert decide_b({"a": other}).compared == {}
    assert decide_b({"a": record("a", [(1000, 50.0)], checkpoint=None)}).compared == {}


def test_a_long_history_is_thinned_to_span_the_whole_run() -> None:
    history: tuple[tuple[int, float], ...] = ()
    for frames in range(0, 100_000, 100):
        history = add_to_history(history, (frames, frames / 100), 10)
        assert len(history) <= 10
    assert history[0] == (0, 0.0) and history[-1] == (99_900, 999.0)
    assert [f for f, _ in history] == sorted(f for f, _ in history)
    assert any(0 < f <= 30_000 for f, _ in history), history  # the early part stays


def test_a_member_that_stops_writing_drops_out_and_rejoins_with_its_next_record(
        tmp_path: Path) -> None:
    reader = SharedFolder(tmp_path, "b", staleness_s=0.5)
    writer = SharedFolder(tmp_path, "a", staleness_s=0.5)
    written = writer.publish(record("a", [(1000, 5.0)]), None)
    assert written.version == 1 and list(reader.peers()) == ["a"]
    time.sleep(0.6)
    assert reader.peers() == {}
    assert writer.read_own() == written  # its own record, whatever its age: a resume reads it
    rejoined = writer.publish(written, None)
    assert rejoined.version == 2 and list(reader.peers()) == ["a"]


def test_an_unreadable_record_is_skipped_and_counted(tmp_path: Path) -> None:
    reader = SharedFolder(tmp_path, "b", staleness_s=60)
    SharedFolder(tmp_path, "a", staleness_s=60).publish(record("a", [(1000, 5.0)]), None)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / RECORD).write_text('{"member": "c", "frames": ')
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / RECORD).write_text('{"member": "d"}')
    (tmp_path / "e").mkdir()  # a's folder copied under another name
    (tmp_path / "e" / RECORD).write_text((tmp_path / "a" / RECORD).read_text())
    assert list(reader.peers()) == ["a"]
    assert reader.unreadable == 3


def test_old_checkpoints_and_killed_writes_are_pruned(tmp_path: Path) -> None:
    folder = SharedFolder(tmp_path / "pop", "a", staleness_s=60, keep_checkpoints=2)
    current = record("a", [(1000, 5.0)])
    for version in range(1, 5):
        source = tmp_path / f"checkpoint_{version:09d}.pt"
        source.write_bytes(b"x" * version)
        current = folder.publish(current, source)
    assert current.checkpoint == "checkpoint_000000004.pt"
    assert folder.checkpoint_of(current).read_bytes() == b"xxxx"
    assert sorted(p.name for p in folder.own.glob("checkpoint_*")) == [
        "checkpoint_000000003.pt", "checkpoint_000000004.pt"]
    (folder.own / ".tmp_killed").write_bytes(b"x")  # a write killed midway
    folder.publish(current, None)
    assert sorted(p.name for p in folder.own.iterdir()) == [
        "checkpoint_000000003.pt", "checkpoint_000000004.pt", RECORD]


# ----- several processes on one folder ----------------------------------------------------------

WRITE_S = 2.0
CHECKPOINT_BYTES = 1 << 19  # large enough that a copy takes many writes


def _payload(member: str, step: int) -> bytes:
    """A checkpoint stand-in whose last 32 bytes are the SHA-256 of the rest: a partial copy
    fails the check."""
    body = hashlib.sha256(f"{member}/{step}".encode()).digest() * (CHECKPOINT_BYTES // 32)
    return body + hashlib.sha256(body).digest()


def _write_loop(folder: str, member: str, scratch: str) -> None:
    """Publish a new checkpoint and record as fast as possible for ``WRITE_S`` seconds."""
    shared = SharedFolder(folder, member, staleness_s=60)
    current = record(member, [(0, 0.0)])
    step = 0
    deadline = time.monotonic() + WRITE_S
    while time.monotonic() < deadline:
        step += 1
        source = Path(scratch, f"checkpoint_{step:09d}.pt")
        source.write_bytes(_payload(member, step))
        history = (*current.history, (step * 100, float(step)))[-100:]
        current = shared.publish(dataclasses.replace(current, frames=step * 100,
                                                     objective=float(step), history=history),
                                 source)
        source.unlink()


def _read_loop(folder: str, results: multiprocessing.Queue) -> None:
    """Read every member's record and the checkpoint it names until the writers are done;
    report (records read, unreadable records, faults)."""
    reader = SharedFolder(folder, "reader", staleness_s=60)
    seen, faults = 0, []
    deadline = time.monotonic() + WRITE_S + 0.5
    while time.monotonic() < deadline:
        for name, peer in reader.peers().items():
            seen += 1
            try:
                data = reader.checkpoint_of(peer).read_bytes()
            except (FileNotFoundError, TypeError):
                # allowed only once newer checkpoints have replaced it: the record moved on
                now = reader.peers().get(name)
                if now is None or now.version <= peer.version:
                    faults.append(f"{name} v{peer.version} names {peer.checkpoint}, missing")
                continue
            if hashlib.sha256(data[:-32]).digest() != data[-32:]:
                faults.append(f"{name} v{peer.version}: partial checkpoint ({len(data)} bytes)")
    results.put((seen, reader.unreadable, faults))


@pytest.mark.timeout(60)
def test_readers_never_see_a_partial_record_or_a_missing_checkpoint(tmp_path: Path) -> None:
    spawn = multiprocessing.get_context("spawn")  # no fork of pytest's threads
    results = spawn.Queue()
    folder = tmp_path / "population"
    processes = [spawn.Process(target=_write_loop, args=(str(folder), f"m{i}",
                                                          str(tmp_path / f"scratch{i}")))
                 for i in range(3)]
    processes += [spawn.Process(target=_read_loop, args=(str(folder), results))
                  for _ in range(2)]
    for i in range(3):
        os.makedirs(tmp_path / f"scratch{i}")
    for process in processes:
        process.start()
    reports = [results.get(timeout=50) for _ in range(2)]
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode == 0
    for seen, unreadable, faults in reports:
        assert seen > 100, reports  # the readers did overlap the writers
        assert unreadable == 0 and faults == [], reports
