"""The tools around a real run: W&B offline logging, the best checkpoint, ``sfbus eval`` on it."""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.multiprocess]
TOPOLOGIES = Path(__file__).parents[2] / "topologies"
_BLOCK = 32768  # the .wandb file: LevelDB's log format, records in 32 KiB blocks
_FULL, _LAST = 1, 4


def wandb_records(path: Path) -> Iterator[object]:
    """The protobuf records of an offline W&B run file."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


@pytest.mark.timeout(240)
def test_wandb_offline_best_checkpoint_and_eval(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGIES / "cartpole.yaml"), "--run-dir",
         str(run_dir), "--max-frames", "40000", "--set", "save_best_after=10000",
         "--set", "wandb.project=sfbus-test", "--set", "wandb.mode=offline"],
        capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]

    # W&B: the TensorBoard scalars against env frames, and the run's settings as config
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    history: dict[str, list[tuple[float, float]]] = {}
    config = {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            # a key with "/" is stored split, as nested_key
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in record.history.item}
            if "env_frames" not in items:  # W&B's own bookkeeping (runtime at the finish)
                continue
            for key, value in items.items():
                history.setdefault(key, []).append((items["env_frames"], value))
        elif kind == "run":
            config = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                      for i in record.run.config.update}
    assert config["env"] == "gym:CartPole-v1" and config["wandb"]["mode"] == "offline"
    # keys: <policy id>/<TensorBoard tag>
    for tag in ("0/reward/reward", "0/train/policy_loss", "0/train/lr", "0/perf/_fps"):
        assert len(history.get(tag, ())) >= 2, (tag, sorted(history))
    frames = [at for at, _ in history["0/train/policy_loss"]]
    # the learner's frames: past --max-frames by the batches still queued when the run stopped
    assert frames == sorted(frames) and 20000 <= frames[-1] <= 60000

    # the best checkpoint: one, written after save_best_after frames, its score recorded
    (best,) = (run_dir / "checkpoints" / "policy_0" / "best").glob("checkpoint_*.pt")
    state = torch.load(best, weights_only=True)
    assert state["env_frames"] >= 10000
    assert state["best"]["metric"] == "true_return" and state["best"]["score"] > 9.0

    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "eval", str(run_dir), "--checkpoint", "best",
         "--episodes", "4", "--deterministic"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"({best.name}, version {state['version']})" in done.stdout
    with (run_dir / "eval" / "eval_policy_0.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert [r["seed"] for r in rows] == ["0", "1", "2", "3", "mean"]
