"""bench.contention: the simulation's actions come from the topology's policies (one pass per
policy acting, each agent's policy drawn at its episode's start), its RNN state carried; the
learners train on batches of their own spaces; the ceiling is every core busy at the parts' CPU
per 1,024 samples."""

import os

import numpy as np
import pytest

from bench import contention
from bench import throughput as tp
from bench import throughput_topologies as tt
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.envs import env_spec
from sfbus_components.models import ModelConfig


def observations(env: str, rows: int) -> dict[str, np.ndarray]:
    """Random observations of ``env``'s spaces, a row each."""
    rng = np.random.default_rng(0)
    return {k: rng.integers(0, 256, (rows, *f.shape)).astype(f.dtype)
            for k, f in env_spec(env).observation_space.items()}


def test_model_actions_act_on_the_observations_and_carry_the_state() -> None:
    spec = env_spec("doom_basic")
    act = tp._ModelActions(DataPathParams(env="doom_basic",
                                          model=ModelConfig(precision="float32")), 3)
    actions = act(observations("doom_basic", 3))
    assert actions.shape == (3, *spec.action_shape)
    assert ((actions >= 0) & (actions < spec.action_heads[0])).all()
    assert act.state.shape == (3, 512) and act.state.abs().sum() > 0  # the GRU's, moved on


def test_each_policy_acting_takes_one_pass_over_its_own_rows() -> None:
    data = DataPathParams(env="doom_basic", num_policies=4, model=ModelConfig(precision="float32"))
    act = tp._ModelActions(data, 6)
    passes: list[tuple[int, int]] = []
    for index, policy in enumerate(act.policies):
        step = policy.step
        policy.step = (lambda obs, state, i=index, step=step:  # type: ignore[method-assign]
                       passes.append((i, len(state))) or step(obs, state))
    act.acting[:] = [0, 2, 2, 0, 2, 2]
    act(observations("doom_basic", 6))
    assert sorted(passes) == [(0, 2), (2, 4)]
    assert act.state.abs().sum(dim=1).gt(0).all()  # every row's state written back
    drawn = set()
    for _ in range(50):  # a new episode draws again, over every policy
        act.new_episodes(np.array([1]))
        drawn.add(int(act.acting[1]))
    assert drawn == {0, 1, 2, 3} and list(act.acting[[0, 2, 3, 4, 5]]) == [0, 2, 0, 2, 2]


@pytest.mark.parametrize("argv, env, envs, workers, policies, rows", [
    (["--workers", "3"], "doom_benchmark", 16, 3, 1, 32),
    (["--duel"], "doom_duel", 1, 2, 4, 16)])
def test_the_learners_train_on_batches_of_their_spaces(argv: list[str], env: str, envs: int,
                                                        workers: int, policies: int,
                                                        rows: int) -> None:
    path, sets = contention.topology_args(contention.main_parser().parse_args(argv))
    data, process = contention.rollout_data(path, sets)
    assert (data.env, data.num_envs, data.num_policies, process.replicas) == (env, envs, policies,
                                                                              workers)
    learners = contention.build_learners(path, sets)
    assert len(learners) == policies
    learner, batch = learners[-1]
    assert batch["actions"].shape == (rows, 32, len(learner.spec.action_heads))
    assert set(batch["obs"]) == set(learner.spec.observation_space)
    version = learner.training.version
    figures = learner.update(batch, learner.params, None)
    assert figures["samples"] == rows * 32 and figures["skipped"] == 0  # finite: all trained
    assert learner.training.version == version + 1


def test_report_adds_the_parts_cpu_per_1024_samples_into_the_ceiling() -> None:
    # 60 s: the simulation 1.2 cores at 4,096 env steps a second (frameskip 4), the learners
    # 0.8 cores at 1,024 samples a second: 1.2 * 60 / (4096 * 60) * 1024 = 0.3 core-s, and 0.8.
    window = tt.Window(frames=4096 * 4 * 60, seconds=60.0,
                       cpu={"simulation.0": (0.6, 17), "simulation.1": (0.6, 17),
                            "learner": (0.8, 1)}, rss=0, pss=0,
                       extra={"histograms": {"learned samples": (1024 * 60.0, 0.0)}})
    rows = contention.report(window, frameskip=4)
    assert "| 0.300 core-s |" in rows[2] and "| 0.800 core-s |" in rows[3]
    cores = len(os.sched_getaffinity(0))
    assert f"**{cores / 1.1 * 4096:,.0f} env frames/s**" in rows[4]


def test_report_refuses_a_window_where_a_part_stood_still() -> None:
    window = tt.Window(frames=4096, seconds=1.0, cpu={"learner": (1.0, 1)}, rss=0, pss=0,
                       extra={"histograms": {"learned samples": (0.0, 0.0)}})
    with pytest.raises(RuntimeError, match="no progress"):
        contention.report(window, frameskip=4)


def test_report_refuses_more_cpu_than_the_machine_has() -> None:
    cores = os.cpu_count() or 1
    window = tt.Window(frames=4096 * 4, seconds=1.0,
                       cpu={"simulation.0": (cores * 3.0, 17), "learner": (cores * 3.0, 1)},
                       rss=0, pss=0, extra={"histograms": {"learned samples": (1024.0, 0.0)}})
    with pytest.raises(RuntimeError, match="CPU figures are wrong"):
        contention.report(window, frameskip=4)


def test_duel_refuses_the_doom_benchmark_sizes() -> None:
    with pytest.raises(SystemExit):
        contention.main(["--duel", "--envs", "4"])
