"""Batched sampling: contiguous slot blocks, slice-served inference, and a short real run."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.batched import BlockSlots
from components.buffers import trajectory_layout
from components.config import DataPathParams
from components.inference import _Rows
from components.messages import ActionsReady, InferenceRequest
from components.policy import Policy
from sfbus import slot
from sfbus.errors import TopologyError
from sfbus.topology import load_topology
from sfbus.topology.model import ProcessSpec
from tests.components import test_inference as ti
from tests.components import test_rollout as tr
from tests.kernel.conftest import hosted

BATCHED = dataclasses.replace(ti.PARAMS, sampling="batched")
TOPOLOGIES = Path(__file__).parents[2] / "topologies"


def test_batched_refuses_a_population() -> None:
    with pytest.raises(ValueError, match="one policy"):
        DataPathParams(num_policies=2, sampling="batched")
    with pytest.raises(TopologyError, match="sampling: batched"):
        load_topology(TOPOLOGIES / "cartpole_pbt4.yaml", ["settings.sampling=batched"])
    topology = load_topology(TOPOLOGIES / "doom_basic_batched.yaml")
    assert topology.settings["sampling"] == "batched"


async def test_inference_serves_a_block_from_a_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gather(*args: Any) -> None:
        raise AssertionError("batched sampling must not gather rows through the request table")

    monkeypatch.setattr(_Rows, "flat_index", no_gather)
    async with ti.run(BATCHED) as actors:
        policy: Policy = ti.trained_policy(1, BATCHED)
        actors["learner"].publish(policy, 3, announce=False)
        rollout, inference = actors["rollout.1"], actors["inference"]
        layout = trajectory_layout(BATCHED, rollout.context.table.topology)
        rps = layout.rows_per_split
        assert layout.slots % rps == 0
        block, t = 2 * rps, 1  # the third block, at step 1
        rng = np.random.default_rng(0)
        obs, rnn = rollout.buffer.numpy["obs.obs"], rollout.buffer.numpy["rnn"]
        obs[block:block + rps, t] = rng.normal(size=obs.shape[2:]) * 3
        rnn[block:block + rps, t] = rng.normal(size=(rps, rnn.shape[2]))
        rollout.inference_requested.emit(InferenceRequest(1, 0, rps, 0, seq=5, block=block, t=t))
        await rollout.wait(1)
        assert rollout.answers == [ActionsReady(1, 0, seq=5)]
        assert inference.blocks is not None and inference.blocks.requests == 1
        # Outputs sit in exactly the block's rows and match the policy on the same inputs.
        ti.check_rows(rollout, [(block + i, t) for i in range(rps)], ti.as_served(actors, BATCHED),
                      version=3)


def test_block_slots_take_whole_free_blocks() -> None:
    class Pool:  # the SlotPool internals BlockSlots uses
        name, size = "w.pool", 8

        def __init__(self) -> None:
            self._free = [7, 6, 5, 4, 3, 2, 1, 0]
            self.state = np.zeros(8, np.int8)

        def _take(self, s: int) -> None:
            self.state[s] = 1

    class Context:
        def shared(self, name: str) -> Any:
            return type("A", (), {"numpy": pool.state})()

    pool = Pool()
    blocks = BlockSlots(Context(), "w", pool, 4)  # type: ignore[arg-type]
    pool.state[1] = 1  # block 0 is partly taken
    pool._free.remove(1)
    assert blocks.try_acquire().tolist() == [4, 5, 6, 7]
    assert blocks.try_acquire() is None
    assert pool._free == [3, 2, 0]


class BlockStandIn(tr.StandInInference):
    """The rollout tests' stand-in, answering block requests (logged like table requests)."""

    @slot
    def on_inference_requested(self, msg: InferenceRequest) -> None:
        """Check the request names a whole block, log its rows, answer."""
        assert msg.block >= 0 and msg.block % msg.count == 0
        rows = np.stack([np.arange(msg.block, msg.block + msg.count),
                         np.full(msg.count, msg.t)], axis=1)
        self.log.append((msg.split, rows))
        buf = self.buffers[msg.worker].numpy
        slots, ts = rows.T
        buf["actions"][slots, ts] = np.stack(
            [self.rng.integers(0, n, msg.count) for n in self.heads], axis=1)
        buf["versions"][slots, ts] = 7
        buf["rnn"][slots, ts + 1] = tr.rnn_marker(ts + 1)[:, None]
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
