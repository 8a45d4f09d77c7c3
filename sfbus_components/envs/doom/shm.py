"""Shared-memory files left in /dev/shm by VizDoom engines that were killed.

A VizDoom game talks to its engine process through files in /dev/shm named after the game's
instance id (``ViZDoomSM<id>``, ``ViZDoomMQCtr<id>``, ``ViZDoomMQDoom<id>``); the engine removes
them when it exits cleanly, but not when it is killed (a rollout worker that crashed, a chaos
test): 48 files stayed after one ``kill -9`` of a worker with 16 envs. Every process that runs
VizDoom sweeps them (:func:`start_sweeper`): files whose engine is gone go a few seconds after
it died. The engine writes its files on every step, so their mtime says when it was last alive.
"""

from __future__ import annotations

import os
import re
import threading
import time

from sfbus import command_lines

SHM_DIR = "/dev/shm"
_SEGMENT = re.compile(r"ViZDoom(?:SM|MQCtr|MQDoom)([A-Za-z0-9]+)")
# A game creates its files a moment before it starts its engine: never touch young files.
_MIN_AGE_S = 3.0
SWEEP_INTERVAL_S = 5.0
_sweeper: threading.Thread | None = None


def live_instance_ids() -> set[str]:
    """Instance ids of the VizDoom engine processes running now (from their command lines)."""
    flag = "+viz_instance_id"
    return {argv[argv.index(flag) + 1] for argv in command_lines().values()
            if flag in argv[:-1]}


def remove_orphaned_segments(min_age_s: float = _MIN_AGE_S) -> list[str]:
    """Remove this user's VizDoom files whose engine is gone; returns the removed paths."""
    live = live_instance_ids()
    now, uid = time.time(), os.getuid()
    removed = []
    for name in os.listdir(SHM_DIR):
        match = _SEGMENT.fullmatch(name)
        if match is None or match.group(1) in live:
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            info = os.stat(path)
            if info.st_uid != uid or now - info.st_mtime < min_age_s:
                continue
            os.unlink(path)
        except OSError:  # another worker removed it first, or it is not ours
            continue
        removed.append(path)
    return removed


def start_sweeper(interval_s: float = SWEEP_INTERVAL_S) -> None:
    """Remove orphaned files now and every ``interval_s`` from a daemon thread, once per
    process (a listing of /dev/shm and of /proc, a few milliseconds)."""
    global _sweeper
    if _sweeper is not None:
        return

    def sweep() -> None:
        while True:
            remove_orphaned_segments()
            time.sleep(interval_s)

    _sweeper = threading.Thread(target=sweep, name="vizdoom-shm-sweeper", daemon=True)
    _sweeper.start()
