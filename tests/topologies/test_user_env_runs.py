"""A user's own env in real multi-process runs: found from the working directory, from an
installed package's `sfbus.envs` entry point, and from a script's `register_env` + `sfbus.run`.

Each run is short (2000 env frames of a 4-way guessing game) and must end with exit 0 and the
frames counted by the stats actor: the rollout workers, in processes of their own, created and
stepped the user's env.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
APP = ROOT / "tests" / "components" / "envs" / "userenv_app"
FRAMES = 2000

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(240)]


def frames_counted(run_dir: Path) -> int:
    """The env frames the run's last progress record counts."""
    lines = (run_dir / "progress.jsonl").read_text().splitlines()
    return json.loads(lines[-1])["env_frames"]


def env_spec_of(run_dir: Path) -> dict:
    """The env spec the launcher recorded for the run (what every worker's buffers hold)."""
    record = json.loads((run_dir / "run.json").read_text())["records"]
    return record["sfbus_components.datapath.record:DataPath"]["layout"]["spec"]


def check_finished(done: subprocess.CompletedProcess[str], run_dir: Path) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    assert frames_counted(run_dir) >= FRAMES


def test_an_env_in_the_working_directory_runs_in_every_process(tmp_path: Path) -> None:
    # The console script, unlike `python -m`, does not put the working directory on the path:
    # the CLI's --app-dir default (".") does, for the launcher and its children.
    script = Path(sys.executable).parent / "sfbus"
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [str(script), "run", "user_env.yaml", "--run-dir", str(run_dir), "--max-frames",
         str(FRAMES), "--max-seconds", "150"],
        cwd=APP, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=200)
    check_finished(done, run_dir)
    assert env_spec_of(run_dir)["action_heads"] == [4]  # GuessEnv's Discrete(4)


def test_an_entry_point_of_an_installed_package_reaches_the_workers(tmp_path: Path) -> None:
    # A package "installed" as pip leaves one: a module and its dist-info on the path.
    site = tmp_path / "site"
    (site / "guessing_envs-1.0.dist-info").mkdir(parents=True)
    (site / "guessing_envs-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: guessing-envs\nVersion: 1.0\n")
    (site / "guessing_envs-1.0.dist-info" / "entry_points.txt").write_text(
        "[sfbus.envs]\nguess_two = guessing_envs:make_two_agents\n")
    (site / "guessing_envs.py").write_text(textwrap.dedent("""
        from sfbus_components.envs.multi_agent import ToyMultiAgentEnv

        def make_two_agents():
            return ToyMultiAgentEnv(num_agents=2)
    """))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(APP / "user_env.yaml"), "--set",
         "env=guess_two", "--run-dir", str(run_dir), "--max-frames", str(FRAMES),
         "--max-seconds", "150"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"},
        capture_output=True, text=True, timeout=200)
    check_finished(done, run_dir)
    assert env_spec_of(run_dir)["num_agents"] == 2  # the entry point's env, not the file's


def test_a_scripts_register_env_reaches_the_workers_of_sfbus_run(tmp_path: Path) -> None:
    # The script's own module sits beside it; the script runs from another directory, so the
    # workers find that module only through the launcher's import path, and the name only
    # through the registration.
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "my_guess.py").write_text(textwrap.dedent("""
        import gymnasium as gym
        import numpy as np

        class Guess(gym.Env):
            observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
            action_space = gym.spaces.Discrete(3)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return self._observe(), {}

            def step(self, action):
                reward = float(int(action) == self.target)
                self.t += 1
                return self._observe(), reward, False, self.t >= 8, {}

            def _observe(self):
                self.target = int(self.np_random.integers(3))
                return np.eye(3, dtype=np.float32)[self.target]
    """))
    run_dir = tmp_path / "run"
    (scripts / "train.py").write_text(textwrap.dedent(f"""
        import sys

        import sfbus
        from sfbus_components.envs import register_env
        from my_guess import Guess

        if __name__ == "__main__":
            register_env("my_guess", Guess)
            sys.exit(sfbus.run({str(APP / "user_env.yaml")!r}, ["env=my_guess"],
                               run_dir={str(run_dir)!r}, max_frames={FRAMES},
                               max_seconds=150))
    """))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, str(scripts / "train.py")], cwd=elsewhere,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=200)
    check_finished(done, run_dir)
    assert env_spec_of(run_dir)["observation_space"]["obs"]["shape"] == [3]  # the script's env
