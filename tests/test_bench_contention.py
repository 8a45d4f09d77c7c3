"""bench.contention: the simulation's actions come from the model, its RNN state carried; the
ceiling is every core busy at the parts' CPU per batch."""

import os

import numpy as np
import pytest

from bench import contention
from bench import throughput as tp
from bench import throughput_topologies as tt
from sfbus_components.envs import env_spec


def test_model_actions_act_on_the_observations_and_carry_the_state() -> None:
    spec = env_spec("doom_basic")
    act = tp._ModelActions("doom_basic", 3, "float32")
    rng = np.random.default_rng(0)
    obs = {k: rng.integers(0, 256, (3, *f.shape), dtype=f.dtype)
           for k, f in spec.observation_space.items()}
    actions = act(obs)
    assert actions.shape == (3, *spec.action_shape)
    assert ((actions >= 0) & (actions < spec.action_heads[0])).all()
    assert act.state.shape == (3, 512) and act.state.abs().sum() > 0  # the GRU's, moved on


def test_report_adds_the_parts_cpu_per_batch_into_the_ceiling() -> None:
    # 60 s: the simulation 1.2 cores at 4,096 env steps a second (frameskip 4), the learner
    # 0.8 cores at 1 step a second: 1.2 * 60 / (4096 * 60) * 1024 = 0.3 core-s, and 0.8.
    window = tt.Window(frames=4096 * 4 * 60, seconds=60.0,
                       cpu={"simulation.0": (0.6, 17), "simulation.1": (0.6, 17),
                            "learner": (0.8, 1)}, rss=0, pss=0,
                       extra={"histograms": {"learner steps": (60.0, 0.0)}})
    rows = contention.report(window, frameskip=4)
    assert "| 0.300 core-s |" in rows[2] and "| 0.800 core-s |" in rows[3]
    cores = len(os.sched_getaffinity(0))
    assert f"**{cores / 1.1 * 4096:,.0f} env frames/s**" in rows[4]


def test_report_refuses_a_window_where_a_part_stood_still() -> None:
    window = tt.Window(frames=4096, seconds=1.0, cpu={"learner": (1.0, 1)}, rss=0, pss=0,
                       extra={"histograms": {"learner steps": (0.0, 0.0)}})
    with pytest.raises(RuntimeError, match="no progress"):
        contention.report(window, frameskip=4)
