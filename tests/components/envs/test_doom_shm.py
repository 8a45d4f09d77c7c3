"""Files that killed VizDoom engines leave in /dev/shm are removed; live and young ones stay."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sfbus_components.envs import make_env
from sfbus_components.envs.doom.shm import SHM_DIR, live_instance_ids, remove_orphaned_segments


def _fake(name: str, age_s: float) -> Path:
    path = Path(SHM_DIR, name)
    path.write_bytes(b"x")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_orphans_go_young_and_live_files_stay() -> None:
    env = make_env("doom_basic")
    orphan = _fake("ViZDoomSMsfbusTestOrphan1", age_s=3600)
    young = _fake("ViZDoomMQCtrsfbusTestYoung1", age_s=0)
    try:
        live = live_instance_ids()
        assert live, "the running game's engine was not found"
        live_files = [n for n in os.listdir(SHM_DIR)
                      if n.startswith("ViZDoom") and any(n.endswith(i) for i in live)]
        assert live_files
        removed = remove_orphaned_segments()
        assert str(orphan) in removed and not orphan.exists()
        assert young.exists()
        assert all(Path(SHM_DIR, name).exists() for name in live_files)
    finally:
        for path in (orphan, young):
            if path.exists():
                path.unlink()
        env.close()
