"""The VizDoom duel through real engines: two player processes in one networked match."""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("vizdoom")

from sfbus_components.envs import make_env
from sfbus_components.envs.doom.duel import DoomDuelEnv
from sfbus_components.envs.doom.match import _instance_id
from sfbus_components.envs.doom.shm import SHM_DIR
from sfbus_components.envs.doom.time_slice import SLICE_NS
from tests.components.envs.test_doom_time_slice import custom_slices, slice_ns


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def _random_actions(env: DoomDuelEnv, rng: np.random.Generator) -> np.ndarray:
    return env.spec.random_actions(rng, env.spec.num_agents)[0]


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_duel_runs_ends_episodes_and_restarts_a_killed_host() -> None:
    env = make_env("doom_duel", episode_timeout=200, seed=3)  # 50 steps an episode
    assert isinstance(env, DoomDuelEnv)
    rng = np.random.default_rng(0)
    try:
        obs = env.reset()
        assert [o["obs"].shape for o in obs] == [(3, 72, 128)] * 2
        assert [o["measurements"].shape for o in obs] == [(19,)] * 2
        engines = env.engine_pids
        assert len(engines) == 2 and all(_alive(p) for p in engines)
        instances = [_instance_id(p) for p in engines]

        ended = []
        for step in range(300):
            obs, rewards, terminated, truncated, infos = env.step(_random_actions(env, rng))
            done = terminated | truncated
            assert done.all() == ("episode_return" in infos[0]) and done.all() == done.any()
            assert rewards.shape == (2,) and np.isfinite(rewards).all()
            assert obs[0]["obs"].any() and obs[1]["obs"].any()
            ended += [(step, info) for info in infos if "episode_return" in info]
            if step == 120:
                os.kill(engines[0], signal.SIGKILL)  # the host's engine
                start = time.monotonic()
                _, _, _, truncated, _ = env.step(_random_actions(env, rng))
                assert time.monotonic() - start < 30
                assert truncated.all() and env.restarts == 1
                assert not any(_alive(p) for p in engines)
                assert env.engine_pids != engines and all(_alive(p) for p in env.engine_pids)
        assert env.restarts == 1
        assert len(ended) >= 2 * 4, ended  # both agents, every 50 steps
        for _, info in ended:
            assert info["episode_length"] <= 50
            assert info["episode_frames"] == 4 * info["episode_length"]
            assert info["episode_win"] in (0.0, 1.0)
            assert info["episode_true_return"] == info["episode_frags"]
        last = env.engine_pids
        instances += [_instance_id(p) for p in last]
    finally:
        env.close()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in last + engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in last + engines)
    # the killed match's files and the closed one's are gone
    assert all(instances)
    assert not [n for n in os.listdir(SHM_DIR) if n.endswith(tuple(instances))]


def _hold_a_match(report: multiprocessing.queues.Queue) -> None:
    """A rollout process stand-in: make a duel, say its players and engines, wait to be killed."""
    env = make_env("doom_duel", episode_timeout=200, seed=1)
    env.reset()
    report.put(env.engine_pids)
    time.sleep(120)


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_players_share_their_owners_session_and_die_with_it() -> None:
    ctx = multiprocessing.get_context("spawn")
    report = ctx.Queue()
    owner = ctx.Process(target=_hold_a_match, args=(report,))
    owner.start()
    try:
        engines = report.get(timeout=60)
        players = [_parent(engine) for engine in engines]
        assert owner.pid not in players  # each engine runs under its player process
        for player, engine in zip(players, engines, strict=True):
            # a group of its own, which killing takes the engine with; the owner's session, so
            # that the scheduler does not give each player a share of its own (autogroup)
            assert os.getpgid(player) == player == os.getpgid(engine)
            assert os.getsid(player) == os.getsid(owner.pid) == os.getsid(engine)
            if custom_slices():  # it busy-polls for its peer: the shortest slice
                assert slice_ns(engine) == SLICE_NS
        os.kill(owner.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(map(_alive, players + engines)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, players + engines))  # the players' watchdogs killed them
    finally:
        owner.kill()
        owner.join()
