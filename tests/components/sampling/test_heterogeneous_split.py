"""A split of agents of different spaces (MPE Simple Tag's predators and prey), driven step by
step with no actor or process: each policy's rows are asked for and answered in its own arrays,
and each agent's observation lands in its policy's arrays, as a replay of the same envs shows."""

from __future__ import annotations

import logging
from typing import NoReturn

import numpy as np

from sfbus_components.datapath.buffers import TrajectoryBuffer, trajectory_layout
from sfbus_components.datapath.messages import InferenceRequest
from sfbus_components.envs import make_env
from sfbus_components.sampling.heterogeneous_split import FixedAgentMapping, HeterogeneousSplit
from sfbus_components.sampling.policy_mapping import AgentPolicies
from sfbus_components.sampling.rollout_params import RolloutParams
from sfbus_components.sampling.splits import SplitWiring
from sfbus_components.sampling.worker_envs import WorkerEnvs, env_seed
from tests.components.sampling.test_splits import Memory

TAG = "pettingzoo:mpe2.simple_tag_v3"
KWARGS = {"num_good": 1, "num_adversaries": 3, "num_obstacles": 2, "max_cycles": 3}
T, SEED = 4, 3  # an episode ends (and the envs reset inside their step) at step 3


def fail(reason: str) -> NoReturn:
    raise AssertionError(reason)


def test_each_policy_acts_and_observes_in_its_own_arrays() -> None:
    params = RolloutParams(env=TAG, env_kwargs=KWARGS, rollout=T, num_envs=2, num_splits=1,
                           batch_size=4 * T, seed=SEED, env_step_timeout_s=0, num_policies=2,
                           agent_policies={"adversary_*": 0, "agent_*": 1})
    layout = trajectory_layout(params, 1)
    memory = Memory(layout)
    buffer = TrajectoryBuffer(memory, "w", layout)  # type: ignore[arg-type]
    population = AgentPolicies(FixedAgentMapping(layout.agent_policies), 2, 2, 4, 1)
    envs = WorkerEnvs(params, "w", 0, 0, 4, population.policy, logging.getLogger(__name__), fail)
    requests: list[InferenceRequest] = []
    wiring = SplitWiring(0, 0, buffer, np.zeros(8, np.int64), population.policy, envs,
                         lambda r, key=None: requests.append(r), lambda e: None)
    split = HeterogeneousSplit(0, wiring, population)
    envs.create(split.reset_outs())
    replays = [make_env(TAG, **KWARGS) for _ in range(2)]
    expected = [replay.spec.empty_agent_obs() for replay in replays]
    for e, (replay, obs) in enumerate(zip(replays, expected, strict=True)):
        replay.reset_into(obs, seed=env_seed(SEED, 0, e))
    views = {p: buffer.of_policy(p) for p in (0, 1)}
    split.start(np.arange(8, dtype=np.int64))  # slot r for row r: env r // 4, agent r % 4
    rng = np.random.default_rng(0)
    for t in range(T):
        requests.clear()
        split.request(seq=t + 1)
        # one request per policy, its rows contiguous in the worker's request table
        assert [(r.policy, r.count) for r in requests] == [(0, 6), (1, 2)]
        chosen = rng.integers(5, size=8)
        for r in requests:  # stand-in inference: writes each policy's actions in its arrays
            rows = buffer.requests[0, r.offset:r.offset + r.count]
            views[r.policy].numpy["actions"][rows[:, 0], rows[:, 1], 0] = chosen[rows[:, 0]]
        for row in range(8):  # each agent's observation in its policy's array, none elsewhere
            policy, env, agent = population.policy[row], row // 4, row % 4
            width = 16 if policy == 0 else 14
            np.testing.assert_array_equal(views[policy].numpy["obs.obs"][row, t],
                                          expected[env][agent]["obs"])
            assert views[policy].numpy["obs.obs"].shape[-1] == width
            assert not views[1 - policy].numpy["obs.obs"][row, t].any()
        split.step()
        for e, replay in enumerate(replays):
            rewards, *_ = replay.step_into([chosen[e * 4 + a:e * 4 + a + 1] for a in range(4)],
                                           expected[e])
            np.testing.assert_array_equal(buffer.numpy["rewards"][e * 4:e * 4 + 4, t], rewards)
    assert (buffer.numpy["policies"][:8, :T] == population.policy[:, None]).all()
    assert split.finish() == population.policy.tolist()
