"""Env faults a rollout worker survives: NaN outputs and hung steps recreate the env."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, ClassVar

import numpy as np
import pytest

from sfbus_components.envs import EnvError
from sfbus_components.envs.guard import EnvStepTimeout, GuardedEnv, StepWatchdog, make_guarded_env
from sfbus_components.envs.multi_agent import ToyMultiAgentEnv
from tests.components.sampling.test_rollout import T, rows_by_trajectory, topology, wait_until
from tests.kernel.conftest import hosted


class FaultyEnv(ToyMultiAgentEnv):
    """A one-agent toy env whose third step goes wrong (``FAULT``) while ``faults`` lasts."""

    FAULT: ClassVar[str] = "nan-reward"
    faults: ClassVar[int] = 0

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(num_agents=1, episode_length=100, seed=seed)
        self.steps = 0
        self.aborted = threading.Event()

    def step_into(self, actions: np.ndarray, obs_out: dict[str, np.ndarray]) -> Any:
        """Step; the third step returns NaN, or hangs, per ``FAULT``."""
        out = super().step_into(actions, obs_out)
        self.steps += 1
        if self.steps != 3 or FaultyEnv.faults <= 0:
            return out
        FaultyEnv.faults -= 1
        fault = type(self).FAULT
        if fault == "nan-reward":
            out[0][0] = np.nan
        elif fault == "inf-obs":
            obs_out["obs"][0, 1] = np.inf
        elif fault == "sleep":
            time.sleep(30)  # only the watchdog's signal gets us out
        elif fault == "abortable" and self.aborted.wait(30):
            raise EnvError("aborted")
        elif fault == "value-error":
            raise ValueError("a bug in the env")
        elif fault == "assertion":
            raise AssertionError("gymnasium's checks")
        elif fault == "bad-shape":
            obs_out["obs"][:] = np.zeros(7)  # an observation of the wrong shape
        return out


class AbortableEnv(FaultyEnv):
    """Hangs on its third step until ``abort()`` (as VizDoom does when its engine is killed)."""

    FAULT = "abortable"

    def abort(self) -> None:
        """Called by the watchdog thread."""
        self.aborted.set()


@pytest.mark.parametrize("fault", ["nan-reward", "inf-obs", "sleep", "abortable", "value-error",
                                   "assertion", "bad-shape"])
async def test_faulty_env_is_recreated_and_its_episode_dropped(fault: str) -> None:
    FaultyEnv.FAULT = fault
    FaultyEnv.faults = 1
    name = "AbortableEnv" if fault == "abortable" else "FaultyEnv"
    topo = topology(env=f"{__name__}:{name}", env_step_timeout_s=0.4)
    started = time.monotonic()
    async with hosted(topo, "inproc") as actors:
        worker, inference, collector = actors["rollout"], actors["inference"], actors["collector"]
        await wait_until(lambda: len(collector.received) >= 8)
        per_row = rows_by_trajectory(inference, collector, worker.rows_per_split)
        assert worker.envs.failures == 1
        if fault in ("sleep", "abortable"):
            assert worker.envs.watchdog.aborts == 1
    assert time.monotonic() - started < 10
    first = per_row[0][0]  # env 0 takes the first third step
    assert first["dones"][:T].tolist() == [0, 0, 1] + [0] * (T - 3)
    assert first["rewards"][2] == 0.0 and np.isfinite(first["obs.obs"]).all()
    assert not collector.episodes  # the broken episode is dropped, not reported


class FragileEnv(ToyMultiAgentEnv):
    """A one-agent toy env whose creation fails while ``creations_to_fail`` lasts."""

    creations_to_fail: ClassVar[int] = 0

    def __init__(self, seed: int | None = None) -> None:
        if FragileEnv.creations_to_fail > 0:
            FragileEnv.creations_to_fail -= 1
            raise RuntimeError("cannot start the engine")
        super().__init__(num_agents=1, episode_length=100, seed=seed)


@pytest.mark.parametrize(("failures", "gives_up"), [(3, False), (99, True)])
async def test_failing_recreation_backs_off_and_gives_up_only_when_it_keeps_failing(
        failures: int, gives_up: bool) -> None:
    FragileEnv.creations_to_fail = 0
    topo = topology(env=f"{__name__}:FragileEnv", env_recreate_attempts=5)
    async with hosted(topo, "inproc") as actors:
        worker, collector = actors["rollout"], actors["collector"]
        await wait_until(lambda: len(collector.received) >= 2)
        reasons: list[str] = []

        def give_up(reason: str) -> None:
            reasons.append(reason)
            raise RuntimeError("the process would end here")

        worker.envs.fail = give_up
        worker.on_failure = lambda where, error: None
        FragileEnv.creations_to_fail = failures
        obs = worker.spec.empty_obs()
        started = time.monotonic()
        if gives_up:
            with pytest.raises(RuntimeError, match="the process would end here"):
                worker.envs.recreate(0, obs, EnvError("broken"))
            assert reasons == ["env 0 could not be recreated in 5 attempts: "
                               "RuntimeError('cannot start the engine')"]
        else:
            worker.envs.recreate(0, obs, EnvError("broken"))
            assert not reasons and FragileEnv.creations_to_fail == 0
            received = len(collector.received)
            await wait_until(lambda: len(collector.received) > received)  # sampling goes on
        assert time.monotonic() - started > 0.1 * (2 ** min(failures, 4) - 1) - 0.05  # backed off
    FragileEnv.creations_to_fail = 0


async def test_envs_failing_over_and_over_end_the_worker_process() -> None:
    FaultyEnv.FAULT = "value-error"
    FaultyEnv.faults = 10**6
    topo = topology(env=f"{__name__}:FaultyEnv", max_env_failures_per_minute=5)
    async with hosted(topo, "inproc") as actors:
        worker = actors["rollout"]
        reasons: list[str] = []
        worker.envs.fail = reasons.append
        await wait_until(lambda: reasons)
        assert reasons[0] == ("6 env failures within a minute, the last: the env's step raised "
                              "ValueError: a bug in the env")
    FaultyEnv.faults = 0


def test_guard_passes_a_healthy_step_through() -> None:
    watchdog = StepWatchdog(1.0)
    try:
        env = make_guarded_env("toy_multi_agent", {"num_agents": 2}, watchdog)
        obs = env.spec.empty_obs()
        env.reset_into(obs, seed=1)
        rewards, _term, _trunc, infos = env.step_into(np.zeros((2, 1), np.int64), obs)
        assert rewards.shape == (2,) and len(infos) == 2
        assert env.engines == set() and watchdog.active is None and watchdog.step == 1
        env.close()
    finally:
        watchdog.close()
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None)


def test_watchdog_kills_a_hung_vizdoom_engine() -> None:
    pytest.importorskip("vizdoom")
    watchdog = StepWatchdog(0.5)
    env: GuardedEnv | None = None
    try:
        env = make_guarded_env("doom_basic", {}, watchdog)
        (engine,) = env.engines
        obs = env.spec.empty_obs()
        env.reset_into(obs, seed=1)
        env.step_into(np.zeros((1, 1), np.int64), obs)
        os.kill(engine, signal.SIGSTOP)  # the engine hangs
        started = time.monotonic()
        with pytest.raises(EnvStepTimeout, match="aborted"):
            env.step_into(np.zeros((1, 1), np.int64), obs)
        assert time.monotonic() - started < 5 and watchdog.aborts == 1
    finally:
        if env is not None:
            env.close()
        watchdog.close()
