"""EnvPool envs (`envpool:<task>`) against raw EnvPool pools, one call per batched step, a real run,
and bad names and settings refused at validation."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import envpool
import numpy as np
import pytest

from sfbus_components.datapath.buffers import TrajectoryBuffer, trajectory_layout
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.envs import env_spec, make_env
from sfbus_components.envs.envpool.pool import EnvPoolBatch
from sfbus_components.envs.vector import VectorEnvs
from sfbus_components.sampling.batched_layout import BatchedSplit
from sfbus_components.sampling.rollout_params import RolloutParams
from sfbus_components.sampling.splits import SplitWiring
from sfbus_components.sampling.worker_envs import WorkerEnvs, env_seed
from tests.components.sampling.test_splits import Memory

TOPOLOGIES = Path(__file__).parents[3] / "topologies"
# What sfbus's atari_<game> envs do, said in EnvPool's own settings (its defaults differ).
ATARI = {"episodic_life": True, "reward_clip": True}


def raw_pool(task: str, count: int, seed: int, **config: Any) -> Any:
    """A bare EnvPool pool with gymnasium's API and its own (next-step) autoreset."""
    with warnings.catch_warnings():  # float32 Boxes from float64 bounds: gymnasium warns
        warnings.filterwarnings("ignore", message=".*precision lowered")
        pool = envpool.make(task, env_type="gymnasium", num_envs=count, seed=seed,
                            num_threads=1, **config)
        assert pool.observation_space is not None  # built (and cached) here
    return pool


def test_envpool_atari_matches_the_atari_envs_spec() -> None:
    ours, theirs = env_spec("envpool:Pong-v5"), env_spec("atari_pong")
    assert ours.observation_space == theirs.observation_space  # uint8 (4, 84, 84): nature_cnn
    assert ours.action_heads == theirs.action_heads == (6,)
    assert ours.frameskip == theirs.frameskip == 4
    cheetah = env_spec("envpool:HalfCheetah-v4")
    assert cheetah.observation_space["obs"].dtype == "float32"
    assert cheetah.action_box is not None and cheetah.action_box.shape == (6,)
    assert cheetah.frameskip == 1  # MuJoCo's frame_skip is physics substeps of one step


def test_batch_matches_raw_envpool_with_same_step_resets() -> None:
    """Each env of the batch against its own raw one-env pool (EnvPool seeds env i with seed +
    i) stepped with the same actions: rewards and dones are the raw step's, and where an episode
    ended the row holds what the raw pool returns on the step after (its autoreset)."""
    count, seed, steps = 3, 11, 700
    batch = EnvPoolBatch("Breakout-v5", count, seed, {})
    raws = [raw_pool("Breakout-v5", 1, seed + i, **ATARI) for i in range(count)]
    obs = {"obs": np.zeros((count, 4, 84, 84), np.uint8)}
    batch.reset_into(obs)
    for i, raw in enumerate(raws):
        first, _ = raw.reset()
        assert np.array_equal(obs["obs"][i], first[0])
    rng = np.random.default_rng(0)
    rewards, dones = np.zeros(count, np.float32), np.zeros(count, bool)
    time_outs = np.zeros(count, bool)
    clipped, score, length = np.zeros(count), np.zeros(count), np.zeros(count, int)
    lives_lost = games = 0
    for _ in range(steps):
        actions = rng.integers(0, 4, (count, 1))
        ended = dict(batch.step_rows(actions, obs, rewards, dones, time_outs))
        for i, raw in enumerate(raws):
            o, r, term, trunc, info = raw.step(actions[i])
            clipped[i] += r[0]
            score[i] += info["reward"][0]
            length[i] += 1
            assert rewards[i] == r[0] and dones[i] == (term[0] or trunc[0])
            assert time_outs[i] == (trunc[0] and not term[0])
            assert r[0] == np.sign(info["reward"][0])  # clipped, as atari_<game>'s
            if not dones[i]:
                assert i not in ended and np.array_equal(obs["obs"][i], o[0])
                continue
            (report,) = ended[i]
            if info["terminated"][0] or trunc[0]:  # the game is over: all its lives reported
                games += 1
                assert report == {"episode_return": clipped[i], "episode_length": length[i],
                                  "episode_frames": 4 * length[i],
                                  "episode_true_return": score[i]}
                clipped[i] = score[i] = length[i] = 0
            else:  # a life lost: a training episode ended, the game goes on
                lives_lost += 1
                assert report == {}
            first, r, term, trunc, _ = raw.step(actions[i])  # EnvPool's autoreset step
            assert r[0] == 0 and not term[0] and not trunc[0]
            assert np.array_equal(obs["obs"][i], first[0])
    assert games >= 2 and lives_lost >= 8  # both kinds of end were checked
    batch.close()


def test_one_env_steps_like_the_batch_and_reports_terminated_apart() -> None:
    env = make_env("envpool:CartPole-v1", seed=4)
    raw = raw_pool("CartPole-v1", 1, 5)
    out = env.spec.empty_obs()
    env.reset_into(out, seed=5)  # a new seed: a new pool
    first, _ = raw.reset()
    assert np.array_equal(out["obs"][0], first[0])
    episodes = 0
    for step in range(200):
        action = np.array([[step % 2 if step < 100 else 1]])
        r, term, trunc, infos = env.step_into(action, out)
        o, r_raw, term_raw, trunc_raw, _ = raw.step(action[:, 0])
        assert (r[0], term[0], trunc[0]) == (r_raw[0], term_raw[0], trunc_raw[0])
        if term[0]:
            episodes += 1
            assert infos[0]["episode_return"] == infos[0]["episode_length"] > 0
            o, *_ = raw.step(action[:, 0])
        assert np.array_equal(out["obs"][0], o[0].astype(np.float32))
    assert episodes >= 3
    env.close()


class CountingPool:
    """A real EnvPool pool whose ``step`` calls are counted."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.steps: list[int] = []
        """The number of envs each call stepped."""

    def step(self, actions: np.ndarray, env_id: np.ndarray | None = None) -> Any:
        """Count, then step the real pool."""
        self.steps.append(len(actions))
        return self.pool.step(actions, env_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


def test_batched_split_steps_its_envs_with_one_envpool_call() -> None:
    """A batched split over a real EnvPool batch: one call for all its envs per step, plus one
    for just the envs whose episode ended; the rows it wrote are the raw pool's."""
    envs_per_split, steps = 6, 8
    params = DataPathParams(env="envpool:CartPole-v1", num_envs=2 * envs_per_split,
                            num_splits=2, rollout=steps, batch_size=2 * envs_per_split * steps,
                            sampling="batched")
    layout = trajectory_layout(params, 1)
    buffer = TrajectoryBuffer(Memory(layout), "w", layout)  # type: ignore[arg-type]
    rollout = RolloutParams(env=params.env, num_envs=params.num_envs, num_splits=2, rollout=steps,
                            batch_size=params.batch_size, sampling="batched", seed=3,
                            env_step_timeout_s=0)
    agents = params.num_envs

    def fail(reason: str) -> Any:
        raise AssertionError(reason)

    envs = WorkerEnvs(rollout, "w", 0, 0, 1, np.zeros(agents, np.int64),
                      logging.getLogger(__name__), fail)
    episodes: list[Any] = []
    wiring = SplitWiring(0, 0, buffer, np.zeros(agents, np.int64), np.zeros(agents, np.int64),
                         envs, lambda payload, key=None: None, episodes.append)
    split = BatchedSplit(1, wiring)
    assert split.make_batch() and isinstance(split.batch, EnvPoolBatch)
    assert envs.envs == []  # no env made one by one
    pool = split.batch.pool = CountingPool(split.batch.pool)  # type: ignore[attr-defined]
    # The raw pool the batch's seed names (split 1 starts at env envs_per_split).
    raw = raw_pool("CartPole-v1", envs_per_split, env_seed(3, 0, envs_per_split) % (2**31 - 2**20))
    expected, _ = raw.reset()
    assert np.array_equal(split.carry_obs["obs"], expected)
    split.start(np.arange(envs_per_split))
    fields, rng = buffer.numpy, np.random.default_rng(1)
    ended_steps = 0
    for _ in range(5 * steps):
        if split.t == steps:
            split.finish()
            split.start(np.arange(envs_per_split))
        t, calls = split.t, len(pool.steps)
        at, at1 = buffer.at(split.at_rows, t), buffer.at(split.at_rows, t + 1)
        fields["actions"][at] = rng.integers(0, 2, (envs_per_split, 1))
        split.step()
        expected, r, term, trunc, _ = raw.step(fields["actions"][at][:, 0])
        done = term | trunc
        assert np.array_equal(fields["rewards"][at], r)
        assert np.array_equal(fields["dones"][at], done)
        if done.any():
            ended_steps += 1
            assert pool.steps[calls:] == [envs_per_split, int(done.sum())]
            first, *_ = raw.step(np.zeros(int(done.sum()), np.int64), np.flatnonzero(done))
            expected[done] = first
        else:
            assert pool.steps[calls:] == [envs_per_split]
        assert np.array_equal(fields["obs.obs"][at1], expected)
    assert ended_steps > 0 and episodes
    envs.close()


@pytest.mark.multiprocess
def test_short_batched_envpool_run_trains_and_reports_episodes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGIES / "cartpole.yaml"), "--run-dir",
         str(run_dir), "--max-frames", "6000", "--set", "sampling=batched", "--set",
         "env=envpool:CartPole-v1"], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    saved = (run_dir / "topology.yaml").read_text()
    assert "sampling: batched" in saved and "envpool:CartPole-v1" in saved
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    policy = records[-1]["policies"]["0"]
    assert records[-1]["env_frames"] >= 6000 and policy["version"] >= 1
    assert policy["episodes"] > 0 and policy["reward"] > 0


@pytest.mark.parametrize("override, message", [
    ("env=envpool:Pongg-v5", "unknown env 'envpool:Pongg-v5'; did you mean 'envpool:Pong-v5'"),
    ("env_kwargs.stack_num=0", "envpool:Pong-v5: stack_num must be an integer >= 1, not 0"),
    ("env_kwargs.num_envs=8", "envpool:Pong-v5: num_envs cannot be set (sfbus sets them)"),
    ("env_kwargs.stack_nun=2", "envpool:Pong-v5: unknown setting(s) stack_nun;"),
    ("env_kwargs.img_height=-3", "envpool:Pong-v5: img_height must be an integer >= 1"),
])
def test_bad_names_and_settings_are_located_errors(override: str, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "validate", str(TOPOLOGIES / "envpool_pong.yaml"),
         "--set", override], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("error: ") and ".yaml:" in line and message in line, line


def test_vector_envs_serve_the_same_one_call_interface() -> None:
    """Envs without a native batch keep the per-env loop behind the same ``step_rows``."""
    envs = [make_env("gym:CartPole-v1") for _ in range(2)]
    vector = VectorEnvs(envs, 0, 2, 1, lambda *a: None)
    obs = {"obs": np.zeros((2, 4), np.float32)}
    for i, out in enumerate(vector.rows_of(obs)):
        envs[i].reset_into(out, seed=i)
    before = obs["obs"].copy()
    rewards, dones, time_outs = np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool)
    assert vector.step_rows(np.zeros((2, 1), np.int64), obs, rewards, dones, time_outs) == []
    assert (rewards == 1).all() and not np.array_equal(obs["obs"], before)
