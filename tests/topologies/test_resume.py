"""SIGTERM to the launcher stops a CartPole run with its final checkpoint; --resume continues it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sfbus.procfs import run_children
from tests.kernel.runs import start_run, wait_for
from tests.topologies.test_chaos import SMALL, frames, progress

pytestmark = pytest.mark.multiprocess
CARTPOLE = Path(__file__).parents[2] / "topologies" / "cartpole.yaml"


@pytest.mark.timeout(240)
def test_sigterm_checkpoints_and_resume_continues_from_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run = start_run(CARTPOLE, run_dir, *SMALL, "--max-seconds", "100")
    try:
        wait_for(lambda: frames(run_dir) > 5000, 60, "training to start")
        run.send_signal(signal.SIGTERM)
        _out, err = run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 130, err[-3000:]
    assert run_children(run_dir) == {}
    saved = re.findall(r"final checkpoint \S+checkpoint_(\d+)\.pt \(version (\d+)\)",
                       (run_dir / "logs" / "learner.log").read_text())
    assert saved, "no final checkpoint"
    version = int(saved[-1][1])
    assert version > 1 and (run_dir / "checkpoints" / "policy_0" /
                            f"checkpoint_{int(saved[-1][0]):09d}.pt").is_file()

    trained = torch.load(run_dir / "checkpoints" / "policy_0" /
                         f"checkpoint_{int(saved[-1][0]):09d}.pt", weights_only=True)["env_frames"]
    first_records = len(progress(run_dir))
    resumed = start_run(CARTPOLE, run_dir, *SMALL, "--resume", str(run_dir),
                        "--max-frames", str(trained + 4000))
    _out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err[-3000:]
    log = (run_dir / "logs" / "learner.log").read_text()
    assert re.search(rf"resumed from \S+ \(version {version}\)", log), log[-2000:]
    records = progress(run_dir)
    assert len(records) > first_records
    # the resumed run's frames count on from the checkpoint's, as --max-frames does: its very
    # first record (0.5 s in) has them, so the progress bar and ETA start where the run stands
    assert all(r["env_frames"] >= trained for r in records[first_records:]), \
        (trained, [r["env_frames"] for r in records[first_records:]])
    # --max-frames counts on from the frames the checkpoint trained on (Sample Factory's
    # train_for_env_steps from its env_steps): the resumed run collects about 4000, not
    # trained + 4000 of its own
    collected = records[-1]["env_frames"] - trained
    assert 4000 <= collected < trained + 4000, (trained, collected)
    versions = [r["policies"]["0"].get("version", 0) for r in records]
    assert max(versions) > version

    # a change the checkpoints cannot take: refused before anything starts (it crash-looped)
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    changed = subprocess.run([sys.executable, "-m", "sfbus", "run", "--resume", str(run_dir),
                              "--set", "model.mlp_layers=[32,32]"],
                             capture_output=True, text=True, timeout=120)
    assert changed.returncode == 2, changed.stderr[-3000:]
    (line,) = changed.stderr.strip().splitlines()
    assert line.startswith(f"error: --resume {run_dir}: actor 'learner': ") and \
        "saved with a different configuration (model.mlp_layers: checkpoint [64, 64], this run " \
        "[32, 32])" in line
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == logs
