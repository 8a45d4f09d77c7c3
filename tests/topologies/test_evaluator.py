"""The evaluator: in-process against stand-in learners, and through real CartPole runs."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from prometheus_client import REGISTRY

from sfbus import Actor, ArraySpec, RunRecords
from sfbus.errors import TopologyError
from sfbus.procfs import run_children
from sfbus.routing import RoutingTable
from sfbus.topology import Topology, load_topology
from sfbus.topology.model import ActorSpec, ProcessSpec
from sfbus_components.datapath.buffers import PolicyWeights, policy_array_specs
from sfbus_components.datapath.record import TrajectoryWriter
from sfbus_components.datapath.settings import DataPathParams, build_policy, published_size
from sfbus_components.envs import EnvSpec, MultiAgentEnv, ObsField, register_env
from sfbus_components.envs.spec import EpisodeStats, ObsDict, StepOutput
from sfbus_components.evaluation.evaluator import Evaluator
from sfbus_components.models import ModelConfig
from tests.components.monitoring.test_tensorboard import scalars
from tests.kernel.conftest import hosted
from tests.kernel.runs import free_port, start_run, wait_for

TOPOLOGIES = Path(__file__).parents[2] / "topologies"
EPISODE = 5  # steps of an EchoEnv episode
INTERVAL = 2.0
EVALUATOR = "processes.evaluator.actors.evaluator.params"


class EchoEnv(MultiAgentEnv):
    """Two agents; each step pays every agent its own action's id, so a return names its policy."""

    def __init__(self, seed: int | None = None) -> None:
        self._spec = EnvSpec({"obs": ObsField((1,), "float32")}, action_heads=(4,), num_agents=2)
        self._stats = EpisodeStats(2, 1)
        self._t = 0

    @property
    def spec(self) -> EnvSpec:
        """Two agents, one 4-way head."""
        return self._spec

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Start an episode; the observation is always zero."""
        self._t = 0
        self._stats.clear()
        obs_out["obs"][:] = 0.0

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Pay each agent its action; end every agent's episode after EPISODE steps."""
        rewards = actions[:, 0].astype(np.float32)
        self._stats.add(rewards)
        self._t += 1
        done = np.full(2, self._t >= EPISODE)
        infos: list[dict[str, Any]] = [{}, {}]
        if done[0]:
            for agent in range(2):
                self._stats.finish(agent, infos[agent])
            self._t = 0
        return rewards, np.zeros(2, bool), done, infos

    def close(self) -> None:
        """Nothing to release."""


register_env("test_echo", EchoEnv)
DATA = DataPathParams(env="test_echo", model=ModelConfig(core="none", mlp_layers=(8,)),
                      num_envs=2, num_policies=2, rollout=4, batch_size=8)


class StandInRollout(TrajectoryWriter):
    """The run's rollout actor, whose parameters the data-path record carries; it samples
    nothing."""

    Params = DataPathParams


class StandInLearner(Actor):
    """Publishes weights of a policy that always picks one action, as the test says."""

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """The published weights of the policy in the actor's name (``learner_<id>``)."""
        return policy_array_specs(int(name[-1]), published_size(DATA))

    def publish(self, action: int, version: int) -> None:
        """Publish ``version``: weights whose argmax is always ``action``."""
        policy = build_policy(DATA)
        with torch.no_grad():
            policy.model.actor.weight.zero_()
            policy.model.actor.bias.copy_(torch.eye(4)[action] * 10)
        PolicyWeights(self.context, int(self.name[-1])).publish(policy.published_tensors(),
                                                                version)


def _sample(name: str, actor: str, policy: int) -> float | None:
    return REGISTRY.get_sample_value(name, {"actor": actor, "policy": str(policy)})


def evaluator_topology(**evaluators: Evaluator.Params) -> Topology:
    """The stand-in rollout actor (sized by DATA), two stand-in learners and ``evaluators``."""
    return Topology("test", "<test>", (
        ProcessSpec("rollout", (ActorSpec("rollout", f"{__name__}:StandInRollout", DATA),)),
        ProcessSpec("learners", (ActorSpec("learner_0", f"{__name__}:StandInLearner", None),
                                 ActorSpec("learner_1", f"{__name__}:StandInLearner", None))),
        ProcessSpec("evaluators", tuple(
            ActorSpec(name, "sfbus_components.evaluation.evaluator:Evaluator", params)
            for name, params in evaluators.items())),
    ), ())


async def test_evaluator_scores_published_weights_against_an_opponent(tmp_path: Path) -> None:
    # After the round at start, rounds only by hand.
    common: dict[str, Any] = dict(interval_s=3600.0, episodes=3, deterministic=True)
    topology = evaluator_topology(vs_one=Evaluator.Params(**common, policies=(0,), opponent=1),
                                  mirror=Evaluator.Params(**common))
    async with hosted(topology, run_dir=str(tmp_path)) as actors:
        learners, vs_one, mirror = (actors["learner_0"], actors["learner_1"]), \
            actors["vs_one"], actors["mirror"]
        async with asyncio.timeout(10):
            while vs_one.rounds < 1 or mirror.rounds < 1:  # the rounds at start: nothing yet
                await asyncio.sleep(0.01)
        assert not (tmp_path / "evaluation.jsonl").exists()
        assert await vs_one.evaluate_round() == []  # still nothing published
        learners[0].publish(action=3, version=1)
        learners[1].publish(action=1, version=1)
        # Agent 0 plays policy 0 and only its episodes count: every return is 5 x 3.
        [score] = await vs_one.evaluate_round()
        assert (score.policy, score.version, score.returns, score.lengths) == \
            (0, 1, [15.0] * 3, [EPISODE] * 3)
        assert await vs_one.evaluate_round() == []  # no new weights: nothing to score
        learners[0].publish(action=2, version=2)
        [score] = await vs_one.evaluate_round()
        assert (score.version, score.returns, score.round) == (2, [10.0] * 3, 4)
        # Every policy plays both agents, and both agents' episodes count.
        scores = await mirror.evaluate_round()
        assert [(s.policy, s.version, s.returns) for s in scores] == \
            [(0, 2, [10.0] * 3), (1, 1, [5.0] * 3)]
        assert all(torch.equal(a, b) for a, b in zip(
            mirror.models[1].published_tensors(), vs_one.models[1].published_tensors(),
            strict=True))
    assert _sample("sfbus_evaluator_episode_reward", "vs_one", 0) == 10.0
    assert _sample("sfbus_evaluator_evaluations_total", "vs_one", 0) == 2.0
    assert _sample("sfbus_evaluator_policy_version", "mirror", 1) == 1.0
    records = [json.loads(line) for line in (tmp_path / "evaluation.jsonl").read_text()
               .splitlines()]
    assert [(r["evaluator"], r["policy"], r["version"], r["mean_return"], r["opponent"])
            for r in records] == [("vs_one", 0, 1, 15.0, 1), ("vs_one", 0, 2, 10.0, 1),
                                  ("mirror", 0, 2, 10.0, -1), ("mirror", 1, 1, 5.0, -1)]
    # Sample Factory's tags, as training writes them, in a run of policy 0's own beside
    # training's (no statistics actor in this topology: no env frames)
    logged = scalars(str(tmp_path / "tensorboard" / "0" / "vs_one"))
    assert (logged["reward/reward"], logged["reward/reward_max"], logged["len/len"]) == \
        ([(0, 15.0), (0, 10.0)], [(0, 15.0), (0, 10.0)], [(0, EPISODE)] * 2)
    assert logged["policy_stats/avg_true_objective"] == logged["reward/reward"]
    assert set(scalars(str(tmp_path / "tensorboard" / "1" / "mirror"))) == set(logged)


def test_evaluator_refuses_policies_the_run_has_not_before_start() -> None:
    # The run's population size is the data-path record's: checked where the launcher sizes
    # the shared arrays, before any process starts.
    for params in (Evaluator.Params(opponent=2), Evaluator.Params(policies=(0, 3))):
        table = RoutingTable(evaluator_topology(evaluator=params))
        with pytest.raises(TopologyError, match=r"actor 'evaluator': policy [23] is not one of "
                                                r"the run's policies 0\.\.1$"):
            table.array_specs()
    with pytest.raises(ValueError, match="opponent must be a policy id or -1, not -2"):
        Evaluator.Params(opponent=-2)


# ----- through real runs ------------------------------------------------------------------------


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "evaluation.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _rounds(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    rounds: dict[int, list[dict[str, Any]]] = {}
    for record in _records(run_dir):
        rounds.setdefault(record["round"], []).append(record)
    return rounds


def _complete(rounds: dict[int, list[dict[str, Any]]], policies: list[int]) -> list[int]:
    return [k for k, records in rounds.items()
            if sorted(r["policy"] for r in records) == policies]


def _evaluate_run(topology: Path, run_dir: Path, policies: list[int],
                  *overrides: str) -> tuple[dict[int, list[dict[str, Any]]], str]:
    """Run until 3 evaluation rounds scored ``policies``; their records and the metrics page."""
    port = free_port()
    run = start_run(topology, run_dir, "--metrics-port", str(port),
                    "--set", f"{EVALUATOR}.interval_s={INTERVAL}",
                    "--set", f"{EVALUATOR}.episodes=2",
                    # every round scores every policy, new weights or not: a strict cadence
                    "--set", f"{EVALUATOR}.min_new_versions=0", *overrides)
    try:
        wait_for(lambda: len(_complete(_rounds(run_dir), policies)) >= 3
                 or run.poll() is not None, 90, "3 evaluation rounds")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            metrics = response.read().decode()
        run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, err[-3000:]  # stopped by us, not by a failure
    assert " raised " not in err, err[-3000:]
    assert run_children(run_dir) == {}
    rounds = _rounds(run_dir)
    if rounds and max(rounds) not in _complete(rounds, policies):
        del rounds[max(rounds)]  # the stop cut the last round short
    first = min(rounds)  # rounds before the first publish score nothing and write nothing
    assert sorted(_complete(rounds, policies)) == sorted(rounds) == \
        list(range(first, first + len(rounds)))
    return rounds, metrics


def _check_scores(rounds: dict[int, list[dict[str, Any]]], policies: list[int]) -> None:
    """Cadence, versions and CartPole-plausible returns of every policy's evaluations."""
    starts = [min(r["time"] for r in rounds[k]) for k in sorted(rounds)]
    ends = [max(r["time"] + r["seconds"] for r in rounds[k]) for k in sorted(rounds)]
    for k in range(1, len(starts)):
        # A round starts an interval after the previous one, or at once if that one ran longer;
        # the slack is for a busy 2-core machine waking a low-priority process late.
        due = max(starts[k - 1] + INTERVAL, ends[k - 1])
        assert due - 0.1 <= starts[k] <= due + 1.5, (starts, ends)
    for policy in policies:
        records = [r for k in sorted(rounds) for r in rounds[k] if r["policy"] == policy]
        assert len(records) >= 2
        versions = [r["version"] for r in records]
        assert versions == sorted(versions) and versions[0] >= 1, versions
        frames = [r["env_frames"] for r in records]
        assert frames == sorted(frames) and frames[-1] > 0, frames
        for r in records:
            # CartPole pays 1 per step, for a few (the pole falls at once) to 500 (truncated).
            assert r["episodes"] == 2 and math.isfinite(r["mean_return"])
            assert 5 <= r["min_return"] <= r["mean_return"] <= r["max_return"] <= 500
            assert r["mean_length"] == r["mean_return"]


@pytest.mark.multiprocess
def test_cartpole_evaluator_reports_at_its_cadence(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    rounds, metrics = _evaluate_run(TOPOLOGIES / "cartpole_eval.yaml", run_dir, [0],
                                    "--set", "num_envs=4", "--set", "batch_size=256")
    _check_scores(rounds, [0])
    reward = re.search(r'sfbus_evaluator_episode_reward\{actor="evaluator",policy="0"\} (\S+)',
                       metrics)
    assert reward is not None and 5 <= float(reward.group(1)) <= 500, metrics[-3000:]
    count = re.search(r'sfbus_evaluator_evaluations_total\{actor="evaluator",policy="0"\} (\S+)',
                      metrics)
    assert count is not None and float(count.group(1)) >= 1
    # TensorBoard got the same figures, against the same env frames, under training's tag.
    records = [r for k in sorted(rounds) for r in rounds[k]]
    logged = scalars(str(run_dir / "tensorboard" / "0" / "evaluator"))["reward/reward"]
    assert logged == [(r["env_frames"], pytest.approx(r["mean_return"]))
                      for r in records]


def two_policy_topology(folder: Path) -> Path:
    """cartpole_pbt4.yaml with 2 policies and without PBT, plus cartpole_eval's evaluator."""
    doc = yaml.safe_load((TOPOLOGIES / "cartpole_pbt4.yaml").read_text())

    def kept(connection: dict[str, str]) -> bool:
        return "pbt" not in (connection["from"].split(".")[0], connection["to"].split(".")[0])

    doc["name"] = "cartpole_eval2"
    doc["settings"]["num_policies"] = 2
    for pbt_only in ("interval", "mutable"):  # no actor reads them without PBT: an error
        del doc["settings"][pbt_only]
    del doc["processes"]["learner"]["actors"]["pbt"]
    doc["processes"]["evaluator"] = yaml.safe_load(
        (TOPOLOGIES / "cartpole_eval.yaml").read_text())["processes"]["evaluator"]
    doc["connections"] = [c for c in doc["connections"] if kept(c)]
    path = folder / "cartpole_eval2.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.multiprocess
def test_evaluator_scores_every_policy_of_a_population(tmp_path: Path) -> None:
    topology = two_policy_topology(tmp_path)
    assert load_topology(topology).settings["num_policies"] == 2
    rounds, _metrics = _evaluate_run(topology, tmp_path / "run", [0, 1],
                                     "--set", "num_envs=4")
    _check_scores(rounds, [0, 1])
