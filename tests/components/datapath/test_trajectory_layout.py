"""How many trajectory slots a worker's buffer has: the back-pressure that bounds policy lag."""

from __future__ import annotations

import pytest

from sfbus_components.datapath.buffers import trajectory_layout
from sfbus_components.datapath.settings import DataPathParams


def params(**overrides: object) -> DataPathParams:
    base = {"env": "gym:CartPole-v1", "num_envs": 8, "rollout": 32, "batch_size": 512}
    return DataPathParams(**{**base, **overrides})  # type: ignore[arg-type]


def test_each_waiting_batch_adds_its_share_of_slots_to_every_worker() -> None:
    # 16 trajectories per batch over 2 workers: 8 slots per worker per waiting batch
    assert [trajectory_layout(params(num_batches_to_accumulate=n), 2).slots
            for n in (0, 1, 2)] == [8, 16, 24]


def test_no_waiting_batch_needs_a_batch_that_all_agents_fill_at_once() -> None:
    assert trajectory_layout(params(num_batches_to_accumulate=0, batch_size=256), 1).slots == 8
    with pytest.raises(ValueError, match="16 trajectories and the run has 8 agents"):
        trajectory_layout(params(num_batches_to_accumulate=0), 1)


def test_no_waiting_batch_is_refused_for_a_population_and_below_zero() -> None:
    with pytest.raises(ValueError, match="num_batches_to_accumulate 0 trains one policy"):
        params(num_batches_to_accumulate=0, num_policies=2)
    with pytest.raises(ValueError, match="must be >= 0"):
        params(num_batches_to_accumulate=-1)
