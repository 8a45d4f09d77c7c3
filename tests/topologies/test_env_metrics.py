"""Custom env metrics end to end: numbers a user's env reports at an episode's end
(``info["episode_extra_stats"]``, as in Sample Factory) reach every report of a real run.

A tiny gymnasium env in the test's folder (found from the working directory, as a user's env is)
ends an episode every 4 steps, reporting ``kills`` = 3 and ``hits/total`` = 0.5 on even episodes,
``kills`` = 5 on odd ones, and two entries that must be dropped (a NaN, a string). One
``sfbus run`` of a few seconds, then each sink is read back from its files: ``progress.jsonl``,
the policy's TensorBoard run, Prometheus's metric files and the status line in the log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.components.monitoring.test_tensorboard import scalars

ROOT = Path(__file__).parents[2]

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

ENV = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np
    from gymnasium import spaces


    class KillsEnv(gym.Env):
        """Episodes of 4 steps; each end reports extra stats, odd and even ones differing."""

        observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        action_space = spaces.Discrete(2)

        def __init__(self):
            self.t, self.episodes = 0, 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(2, np.float32), {}

        def step(self, action):
            self.t += 1
            info = {}
            if self.t == 4:
                odd = self.episodes % 2
                self.episodes += 1
                info["episode_extra_stats"] = (
                    {"kills": np.float32(5.0)} if odd else
                    {"kills": 3, "hits/total": 0.5, "broken": float("nan"), "text": "x"})
            return np.zeros(2, np.float32), 1.0, False, self.t == 4, info
''')


def test_extra_stats_reach_progress_tensorboard_metrics_and_the_status_line(
        tmp_path: Path) -> None:
    (tmp_path / "kills_env.py").write_text(ENV)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(ROOT / "topologies" / "cartpole.yaml"),
         "--set", "env=kills_env:KillsEnv", "--set", "num_envs=4", "--set", "rollout=16",
         "--set", "batch_size=128", "--set", "report_every_s=1", "--set", "show_stats=[kills]",
         "--run-dir", str(run_dir), "--max-frames", "4000", "--max-seconds", "60"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    # every env sends as many odd as even episodes, give or take one each: kills averages near 4;
    # hits/total is reported by even episodes only and averages over them alone
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    last = records[-1]["policies"]["0"]["extra_stats"]
    assert set(last) == {"kills", "hits/total"}  # the NaN and the string were dropped
    assert 3.8 <= last["kills"] <= 4.2 and last["hits/total"] == 0.5

    found = scalars(str(run_dir / "tensorboard" / "0"))
    kills = [value for _, value in found["policy_stats/avg_kills"]]
    assert kills and all(3.0 <= value <= 5.0 for value in kills)
    assert abs(sum(kills) / len(kills) - 4.0) < 0.5
    assert {value for _, value in found["hits/total"]} == {0.5}

    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(run_dir / "metrics"))
    samples = {sample.labels["name"]: sample.value for family in registry.collect()
               if family.name == "sfbus_runner_episode_stat" for sample in family.samples}
    assert samples["kills"] == pytest.approx(last["kills"]) and samples["hits/total"] == 0.5

    # the status line (logged each report when stderr is no terminal) shows the asked-for name
    logs = "".join(path.read_text() for path in (run_dir / "logs").glob("*.log"))
    shown = [float(v) for v in re.findall(r"\| kills (\d+\.\d\d) \|", logs)]
    assert shown and all(3.5 <= value <= 4.5 for value in shown), logs[-2000:]
    # a bad value costs one rate-limited warning (one rollout process, a run under a minute),
    # however many episodes sent it, and never the run
    assert logs.count("not a finite number") == 1, logs[-2000:]
