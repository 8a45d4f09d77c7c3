"""The trajectories record keeps the shared buffer's names, from the buffer to the loss."""

from __future__ import annotations

from typing import get_type_hints

from sfbus_components.algo.trajectories import STEP_KEYS, Trajectories
from sfbus_components.datapath.buffers import trajectory_layout
from sfbus_components.datapath.settings import DataPathParams

LEARNER_ADDS = {"valids", "learner_version", "targets", "advantages"}


def test_every_buffer_array_is_a_field_under_its_own_name() -> None:
    """A dict observation's arrays ``obs.<key>`` are the nested ``obs``; every other array of the
    buffer is a field of the record by its very name, and the record has no field of its own
    beside what the learner adds."""
    layout = trajectory_layout(DataPathParams(env="gym:CartPole-v1", rollout=4, num_envs=2,
                                              batch_size=8), workers=1)
    arrays = layout.field_shapes()
    buffer_fields = {name.split(".")[0] for name in arrays}
    assert buffer_fields == set(get_type_hints(Trajectories)) - LEARNER_ADDS
    assert {name for name in arrays if "." in name} == {"obs.obs"}
    assert set(STEP_KEYS) == buffer_fields - {"obs", "rnn"} | LEARNER_ADDS - {"learner_version"}
