"""Batched sampling: contiguous slot blocks, the block layout, slice-served inference, the vector
env step, the learner's copy, and short real runs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from sfbus import slot
from sfbus.errors import TopologyError
from sfbus.topology import load_topology
from sfbus.topology.model import ProcessSpec
from sfbus_components.datapath.buffers import TrajectoryBuffer
from sfbus_components.datapath.messages import ActionsReady, BatchReady, InferenceRequest
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.envs import EnvError
from sfbus_components.envs.multi_agent import ToyMultiAgentEnv
from sfbus_components.envs.vector import VectorEnvs
from sfbus_components.models.policy import Policy
from sfbus_components.sampling.inference_worker import _Rows
from tests.components.learning import test_learner as tl
from tests.components.sampling import test_inference as ti
from tests.components.sampling import test_rollout as tr
from tests.kernel.conftest import hosted

BATCHED = dataclasses.replace(ti.PARAMS, sampling="batched")
TOPOLOGIES = Path(__file__).parents[3] / "topologies"


def test_batched_refuses_a_population() -> None:
    with pytest.raises(ValueError, match="one policy"):
        DataPathParams(num_policies=2, sampling="batched")
    with pytest.raises(TopologyError, match="sampling: batched"):
        load_topology(TOPOLOGIES / "cartpole_pbt4.yaml", ["settings.sampling=batched"])
    topology = load_topology(TOPOLOGIES / "doom_basic_batched.yaml")
    assert topology.settings["sampling"] == "batched"


def slot_major(buffer: TrajectoryBuffer) -> dict[str, np.ndarray]:
    """Copies of every field laid out ``[slot, t, ...]``, whatever the buffer's layout."""
    every = np.arange(buffer.layout.slots)
    return {k: v[buffer.at(every, slice(None))] for k, v in buffer.numpy.items()}


async def test_inference_serves_a_block_from_a_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gather(*args: Any) -> None:
        raise AssertionError("batched sampling must not gather rows through the request table")

    monkeypatch.setattr(_Rows, "flat_index", no_gather)
    async with ti.run(BATCHED) as actors:
        policy: Policy = ti.trained_policy(1, BATCHED)
        actors["learner"].publish(policy, 3, announce=False)
        rollout, inference = actors["rollout.1"], actors["inference"]
        layout = rollout.context.records[DataPath].layout
        rps = layout.rows_per_split
        assert layout.slots % rps == 0
        block, t = 2 * rps, 1  # the third block, at step 1
        rng = np.random.default_rng(0)
        obs, rnn = rollout.buffer.numpy["obs.obs"], rollout.buffer.numpy["rnn"]
        assert obs.shape[:3] == (layout.slots // rps, BATCHED.rollout + 1, rps)
        at = rollout.buffer.at(slice(block, block + rps), t)
        written = obs[at]
        assert written.flags.c_contiguous and np.shares_memory(written, obs)
        written[:] = rng.normal(size=obs.shape[3:]) * 3
        rnn[at] = rng.normal(size=(rps, rnn.shape[-1]))
        request = InferenceRequest(1, 0, rps, 0, seq=5, block=block, t=t)
        rollout.inference_requested.emit(request)
        await rollout.wait(1)
        assert rollout.answers == [ActionsReady(1, 0, seq=5)]
        served = inference.blocks
        assert served is not None and served.requests == 1
        # What the inference worker runs on: one contiguous view of its own mapping of the
        # shared array, holding what the rollout worker wrote.
        field = served.obs[1]["obs"]
        read = field[served.at(request)[0]]
        assert read.shape == (rps, *obs.shape[3:]) and read.is_contiguous()
        assert read.untyped_storage().data_ptr() == field.untyped_storage().data_ptr()
        assert torch.equal(read, torch.from_numpy(written))
        # Outputs sit in exactly the block's rows and match the policy on the same inputs.
        ti.check_rows(SimpleNamespace(buffer=SimpleNamespace(numpy=slot_major(rollout.buffer))),
                      [(block + i, t) for i in range(rps)], ti.as_served(actors, BATCHED),
                      version=3)


async def test_learner_copies_a_batch_out_of_the_block_layout() -> None:
    async with hosted(tl.learner_topology(sampling="batched")) as actors:
        learner, driver = actors["learner"], actors["driver"]
        workers = [actors["rollout.0"], actors["rollout.1"]]
        await tl.until(lambda: driver.idle == 1)
        buffer = workers[0].buffer
        assert buffer.layout.block_rows == 2 and buffer.numpy["rewards"].ndim == 3
        # Slots across blocks and rows, out of order, as a batcher assembles them.
        msg = BatchReady(0, (0, 1, 0, 1, 1, 0, 0, 1), (13, 0, 3, 2, 5, 4, 0, 11))
        batch, groups = learner.batches.copy(msg)
        order = [(w, s) for w, slots in groups.items() for s in slots]
        steps, state = tl.T, learner.data.state_size
        assert batch["obs"]["obs"].shape == (8, steps + 1, 4) and batch["rnn"].shape == (8, state)
        for i, (w, s) in enumerate(order):
            b = workers[w].buffer
            fields = b.torch
            copied = {**{f"obs.{k}": v for k, v in batch["obs"].items()},
                      **{k: v for k, v in batch.items() if k != "obs"}}
            for key, value in copied.items():
                t = slice(None) if key.startswith("obs.") else slice(steps)
                expected = (fields["rnn"][b.at(s, 0)][:state] if key == "rnn"
                            else fields[key][b.at(s, t)])
                assert torch.equal(value[i], expected), (key, w, s)


class BlockStandIn(tr.StandInInference):
    """The rollout tests' stand-in, answering block requests (logged like table requests)."""

    @slot
    def on_inference_requested(self, msg: InferenceRequest) -> None:
        """Check the request names a whole block, log its rows, answer."""
        assert msg.block >= 0 and msg.block % msg.count == 0
        rows = np.stack([np.arange(msg.block, msg.block + msg.count),
                         np.full(msg.count, msg.t)], axis=1)
        self.log.append((msg.split, rows))
        buffer = self.buffers[msg.worker]
        buf, (slots, ts) = buffer.numpy, rows.T
        buf["actions"][buffer.at(slots, ts)] = np.stack(
            [self.rng.integers(0, n, msg.count) for n in self.heads], axis=1)
        buf["versions"][buffer.at(slots, ts)] = 7
        buf["rnn"][buffer.at(slots, ts + 1)] = tr.rnn_marker(ts + 1)[:, None]
        self.actions_ready.emit(ActionsReady(msg.worker, msg.split, msg.seq), key=msg.worker)


@pytest.mark.parametrize("env, env_kwargs", [("gym:CartPole-v1", {}),
                                              ("toy_multi_agent", {"episode_length": 5})])
async def test_batched_rollout_matches_a_replayed_env(env: str, env_kwargs: dict) -> None:
    topo = tr.topology(env=env, env_kwargs=env_kwargs, sampling="batched")
    infer = topo.processes[1]
    spec = dataclasses.replace(infer.actors[0], class_path=f"{__name__}:BlockStandIn")
    processes = (topo.processes[0], ProcessSpec(infer.name, (spec,), infer.replicas),
                 topo.processes[2])
    topo = dataclasses.replace(topo, processes=processes)
    na = 2 if env == "toy_multi_agent" else 1
    trajectories = 3
    async with hosted(topo, "inproc") as actors:
        collector = actors["collector"]
        await tr.wait_until(lambda: len(collector.received) >= 4 * na * trajectories)
        per_row = tr.rows_by_trajectory(actors["inference"], collector, 2 * na)
    tr.check_replay(env, env_kwargs, per_row, na, trajectories)


class BrokenEnv(ToyMultiAgentEnv):
    """A toy env whose engine dies at its first step."""

    def step_into(self, actions: np.ndarray, obs_out: dict) -> Any:
        """Fail like a dead engine."""
        raise EnvError("engine died")


def test_vector_step_writes_every_env_into_its_rows() -> None:
    na, steps = 2, 3
    envs = [ToyMultiAgentEnv(na, episode_length=2, seed=e) for e in range(3)]
    replays = [ToyMultiAgentEnv(na, episode_length=2, seed=e) for e in range(1, 3)]
    recreated: list[tuple[int, int]] = []

    def recreate(e: int, out: dict, error: EnvError) -> None:
        recreated.append((e, len(out["obs"])))
        envs[e] = ToyMultiAgentEnv(na, episode_length=2, seed=e)
        envs[e].reset_into(out, seed=e)

    vector = VectorEnvs(envs, 1, 2, na, recreate)  # envs 1 and 2: rows 0..3
    rows = 2 * na
    obs = np.zeros((rows, 4), np.float32)
    expected = np.zeros_like(obs)
    for i, env in enumerate(replays):
        envs[i + 1].reset_into({"obs": obs[i * na:(i + 1) * na]})
        env.reset_into({"obs": expected[i * na:(i + 1) * na]})
    rewards, dones = np.full(rows, np.nan, np.float32), np.zeros(rows, bool)
    time_outs = np.zeros(rows, bool)
    for t in range(steps):
        actions = np.arange(rows).reshape(rows, 1) % 4
        ended = vector.step_into(actions, vector.rows_of({"obs": obs}), rewards, dones,
                                 time_outs)
        for i, env in enumerate(replays):
            r, term, trunc, _ = env.step_into(actions[i * na:(i + 1) * na],
                                              {"obs": expected[i * na:(i + 1) * na]})
            assert np.array_equal(rewards[i * na:(i + 1) * na], r)
            assert np.array_equal(dones[i * na:(i + 1) * na], trunc)
            assert np.array_equal(time_outs[i * na:(i + 1) * na], trunc & ~term)
        assert np.array_equal(obs, expected)
        assert [a for a, _ in ended] == ([0, na] if t == 1 else [])
        assert all("episode_return" in info for _, infos in ended for info in infos)

    envs[2] = BrokenEnv(na, seed=9)
    time_outs[:] = True
    ended = vector.step_into(np.zeros((rows, 1), np.int64), vector.rows_of({"obs": obs}),
                             rewards, dones, time_outs)
    assert recreated == [(2, na)] and isinstance(envs[2], ToyMultiAgentEnv)
    assert dones[na:].all() and (rewards[na:] == 0).all() and not time_outs[na:].any()
    assert ended[-1] == (na, [{}, {}])  # done (its rows' state is zeroed), no episode to report


@pytest.mark.multiprocess
def test_short_batched_cartpole_run_trains(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGIES / "cartpole.yaml"), "--run-dir",
         str(run_dir), "--max-frames", "6000", "--set", "sampling=batched"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sampling: batched" in (run_dir / "topology.yaml").read_text()
    versions = [int(p.stem.split("_")[1])
                for p in (run_dir / "checkpoints" / "policy_0").glob("checkpoint_*.pt")]
    assert versions and max(versions) >= 3


@pytest.mark.multiprocess
@pytest.mark.slow  # VizDoom engines and four processes' torch imports: ~25-40 s on 2 cores
def test_short_doom_basic_batched_run_trains(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGIES / "doom_basic_batched.yaml"),
         "--run-dir", str(run_dir), "--max-seconds", "8", "--set",
         "processes.rollout.replicas=1", "--set", "num_envs=4", "--set", "batch_size=128"],
        capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    versions = [int(p.stem.split("_")[1])
                for p in (run_dir / "checkpoints" / "policy_0").glob("checkpoint_*.pt")]
    assert versions and max(versions) >= 2, done.stderr[-3000:]
