"""The snapshot store: append-only, atomic, read back by a resumed run; torn writes skipped."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sfbus_components.league.store import INDEX, SnapshotStore


def test_snapshots_are_listed_and_read_back_by_a_new_store(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "league")
    assert len(store) == 0 and store.newest(0) is None
    first = store.add(0, 3, 1000, torch.arange(5.0), "first")
    second = store.add(1, 7, 2500, torch.full((5,), 2.0), "frames")
    assert (first.snapshot, second.snapshot) == (0, 1)
    assert second.file == "snapshot_000001.pt"
    again = SnapshotStore(tmp_path / "league")
    assert again.snapshots == [first, second]
    assert torch.equal(again.weights(0), torch.arange(5.0))
    assert again.newest(1) == second and again.newest(2) is None
    lines = [json.loads(line) for line in (tmp_path / "league" / INDEX).read_text().splitlines()]
    assert [(e["policy"], e["version"], e["env_frames"], e["reason"]) for e in lines] == [
        (0, 3, 1000, "first"), (1, 7, 2500, "frames")]
    assert not list((tmp_path / "league").glob(".snapshot_*"))  # no temporary file left


def test_a_torn_line_and_a_lost_file_are_skipped_and_the_next_line_is_whole(
        tmp_path: Path) -> None:
    folder = tmp_path / "league"
    store = SnapshotStore(folder)
    store.add(0, 1, 10, torch.zeros(3), "first")
    store.add(0, 2, 20, torch.ones(3), "frames")
    (folder / "snapshot_000001.pt").unlink()  # listed, but its file is gone
    (folder / ".snapshot_x.tmp").write_bytes(b"half")  # a writer killed mid-write
    with (folder / INDEX).open("a") as index:
        index.write('{"snapshot": 2, "pol')  # a crash mid-append
    store = SnapshotStore(folder)
    assert [s.version for s in store.snapshots] == [1]
    assert not (folder / ".snapshot_x.tmp").exists()
    added = store.add(0, 3, 30, torch.full((3,), 3.0), "win_rate")
    assert added.snapshot == 2 and added.file == "snapshot_000002.pt"  # 1's name stays unused
    assert [(s.snapshot, s.version) for s in SnapshotStore(folder).snapshots] == [(0, 1), (2, 3)]
    assert torch.equal(SnapshotStore(folder).weights(2), torch.full((3,), 3.0))
