"""Short real ``sfbus run``s of topologies/cartpole.yaml on a test env, for the tests that claim a
run learns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mean_rewards(run_dir: Path, env: str, frames: int, *sets: str, timeout: float) -> list[float]:
    """Run cartpole.yaml with ``env=ENV`` and ``sets`` to ``frames``; the 100-episode mean reward
    of each progress record that has episodes."""
    # seed 0 unless ``sets`` give one (a later --set wins): the learning claims were checked on
    # it, and a run given no seed draws one at random
    args = [a for s in (f"env={env}", "seed=0", *sets) for a in ("--set", s)]
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(ROOT / "topologies" / "cartpole.yaml"),
         "--run-dir", str(run_dir), "--max-frames", str(frames), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [r["policies"]["0"]["reward"] for r in records if r["policies"]["0"]["episodes"]]
