"""Sample Factory's experience decorrelation: envs of a worker start at different points of
their episodes, and workers start collecting at different times."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sfbus_components.envs import register_env
from sfbus_components.envs.spec import EnvSpec, EpisodeStats, MultiAgentEnv, ObsDict, ObsField
from sfbus_components.sampling.rollout_params import RolloutParams
from sfbus_components.sampling.worker_envs import WorkerEnvs

ROOT = Path(__file__).parents[3]


class StepCounter(MultiAgentEnv):
    """Observes how many steps it has taken since creation; episodes of 50 steps."""

    def __init__(self, seed: int | None = None) -> None:
        self.steps = 0
        self.stats = EpisodeStats(1, 1)
        self._spec = EnvSpec({"obs": ObsField((1,), "float32")}, action_heads=(2,))

    @property
    def spec(self) -> EnvSpec:
        """One float: the steps taken."""
        return self._spec

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Write the step count."""
        obs_out["obs"][0, 0] = self.steps

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> Any:
        """Count the step; episodes end every 50 steps."""
        self.steps += 1
        done = self.steps % 50 == 0
        obs_out["obs"][0, 0] = self.steps
        return np.zeros(1, np.float32), np.array([done]), np.array([False]), [{}]

    def close(self) -> None:
        """Nothing to release."""


def test_env_e_of_a_worker_starts_rollout_times_e_steps_in():
    register_env("step_counter", StepCounter)

    def fail(reason: str) -> Any:
        raise AssertionError(reason)

    for decorrelate, expected in ((True, [0, 8, 16, 24]), (False, [0, 0, 0, 0])):
        params = RolloutParams(env="step_counter", rollout=8, num_envs=4,
                               decorrelate_envs_on_one_worker=decorrelate)
        envs = WorkerEnvs(params, "w", 0, 0, 1, np.zeros(4, np.int64),
                          logging.getLogger(__name__), fail)
        outs = [StepCounter().spec.empty_obs() for _ in range(4)]
        try:
            envs.create(outs)
            assert [env.steps for env in (e.env for e in envs.envs)] == expected
            assert [float(out["obs"][0, 0]) for out in outs] == expected  # rows carry it on
        finally:
            envs.close()  # stops the step watchdog and gives its signal handler back


def test_decorrelation_wait_must_be_finite_and_not_negative():
    for value in (-1.0, float("inf")):
        with pytest.raises(ValueError, match="decorrelate_experience_max_seconds"):
            RolloutParams(decorrelate_experience_max_seconds=value)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_wait_their_share_after_their_first_trajectories(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(ROOT / "topologies" / "cartpole.yaml"),
         "--run-dir", str(tmp_path / "run"), "--max-frames", "20000",
         "--set", "processes.rollout.replicas=2", "--set", "decorrelate_experience_max_seconds=3",
         "--set", "decorrelate_envs_on_one_worker=true"],
        capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollout.1: waits 1.5 s to decorrelate experience" in done.stderr
    assert "rollout.0: waits" not in done.stderr  # worker 0 of 2 waits 0 s
