"""The evaluator: scores each policy's latest weights on envs of its own, beside training.

It plays a round when it starts and every ``interval_s`` seconds after: each evaluated policy whose
learner published at least ``min_new_versions`` versions since its last evaluation has its weights
copied out of shared memory (the seqlock read inference uses) and plays ``episodes`` episodes,
and the scores are reported four ways: Prometheus gauges
``sfbus_evaluator_episode_reward{actor,policy}`` (mean return), ``..._episode_reward_std``,
``..._episode_length``, ``..._policy_version`` and the counter
``sfbus_evaluator_evaluations_total``; one log line; one JSON record in
``<run_dir>/evaluation.jsonl`` (``evaluator``, ``round``, ``time``, ``env_frames``, ``policy``,
``version``, ``mean_return``, ``std_return``, ``min_return``, ``max_return``, ``mean_length``,
``episodes``, ``deterministic``, ``opponent``, ``seconds``, and ``mean_true_return`` when the env
shapes its reward); and TensorBoard scalars under Sample Factory's tags, as training writes them
(:mod:`sfbus_components.monitoring.tensorboard`): ``reward/reward`` (``_min``, ``_max``),
``len/len`` (in env frames) and ``policy_stats/avg_true_objective``, in a run of each policy's
own beside training's, ``<run_dir>/tensorboard/<policy id>/<actor name>/``, so TensorBoard draws
a policy's evaluation and training on one chart (a folder apart from training's ``<policy id>/``:
TensorBoard stops reading a folder's older event file once a newer one appears, and two writers
would keep both growing).

Time sets the cadence, not learner versions: versions come 100 times faster on CartPole than on
VizDoom, while "every few minutes" means the same everywhere; ``min_new_versions`` skips weights
already scored (a stalled or finished learner). All policies of a round play from the same env
seed, so they are compared on the same episodes.

It takes no connections: weights come from shared memory, and the run's env frames (the step of
every record) from the statistics actor's shared totals (:mod:`sfbus_components.monitoring.stats`; 0
without one).
Any topology gains an evaluator with one process, best at a low priority so that it takes only
idle CPU from the samplers and learners::

    EVALUATOR=sfbus_components.evaluation.evaluator:Evaluator
    sfbus run topologies/doom_basic.yaml --set processes.evaluator.nice=10 \\
        --set processes.evaluator.actors.evaluator.class=$EVALUATOR

Episodes (:mod:`sfbus_components.evaluation.episode_player`) are stepped in a worker thread,
``_CHUNK_STEPS`` steps at a time, so the event loop keeps heart-beating and a stop waits for one
chunk at most.
Multi-agent envs: with ``opponent`` -1 every agent plays the evaluated policy and every agent's
episodes count (an env's built-in bots play as the env makes them); with a policy id, agent 0
plays the evaluated policy, the other agents that policy's latest weights, and only agent 0's
episodes count.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from sfbus import Actor, ArraySpec, Interval, RunRecords, Topology
from sfbus_components.datapath.buffers import PolicyWeights, flat_size, totals_name, weights_name
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.settings import build_policy
from sfbus_components.envs import EnvError, make_env
from sfbus_components.envs.action_bounds import bound_actions
from sfbus_components.evaluation.episode_player import EpisodePlayer
from sfbus_components.monitoring.stats import Stats

_T = TypeVar("_T")
# Env steps per trip to the worker thread: a few milliseconds of CartPole, about a second of
# VizDoom with the paper's model, so a stop waits for little and a round yields to the loop often.
_CHUNK_STEPS = 256
_SEED_SALT = 0xE7A1  # keeps evaluation episodes apart from the rollout workers' seeds


@dataclass(frozen=True)
class Score:
    """The episodes one policy played in one evaluation."""

    policy: int
    version: int
    round: int
    env_frames: int
    time: float
    """Unix time the weights were read."""
    returns: list[float]
    lengths: list[int]
    true_returns: list[float]
    """The env's unshaped scores (NaN where the env does not shape its reward)."""
    seconds: float

    def record(self, evaluator: str, deterministic: bool, opponent: int) -> dict[str, Any]:
        """The JSON record of ``evaluation.jsonl``."""
        returns = np.asarray(self.returns)
        record = {"evaluator": evaluator, "round": self.round, "time": self.time,
                  "env_frames": self.env_frames, "policy": self.policy, "version": self.version,
                  "mean_return": float(returns.mean()), "std_return": float(returns.std()),
                  "min_return": float(returns.min()), "max_return": float(returns.max()),
                  "mean_length": float(np.mean(self.lengths)), "episodes": len(self.returns),
                  "deterministic": deterministic, "opponent": opponent,
                  "seconds": round(self.seconds, 3)}
        if not any(math.isnan(r) for r in self.true_returns):
            record["mean_true_return"] = float(np.mean(self.true_returns))
        return record


class Evaluator(Actor):
    """Periodically plays each policy's latest published weights and reports the scores."""

    component = "evaluator"
    records = (DataPath,)

    @dataclass(frozen=True)
    class Params:
        """The evaluator's own knobs; env, model, seed and population size are the run's data
        path's (``context.records[DataPath].params``)."""

        interval_s: Interval = 300.0
        """Seconds between the starts of evaluation rounds; a round that runs longer delays the
        next one (rounds never overlap)."""
        episodes: int = 10
        """Episodes per policy and round (episodes of counted agents, see ``opponent``)."""
        deterministic: bool = False
        """Act with the most likely action (argmax) instead of sampling as in training."""
        policies: tuple[int, ...] = ()
        """Policy ids to evaluate; empty: every policy of the run (0 .. num_policies - 1)."""
        opponent: int = -1
        """Multi-agent envs: the policy playing agents 1.. against the evaluated agent 0; -1:
        the evaluated policy plays every agent (and every agent's episodes count)."""
        min_new_versions: int = 1
        """Versions a policy must have published since its last evaluation to be evaluated
        again; 0 evaluates unchanged weights too."""
        torch_threads: int = 1
        """Intra-op threads of torch: one batch of a few rows needs no more, and more would take
        cores from the samplers."""

        def __post_init__(self) -> None:
            if self.episodes < 1 or self.min_new_versions < 0:
                raise ValueError("episodes must be >= 1 and min_new_versions >= 0")
            if self.opponent < -1:
                raise ValueError(f"opponent must be a policy id or -1, not {self.opponent}")

    @classmethod
    def shared_arrays(cls, name: str, params: Params, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """None: the launcher's hook is where the policies named are checked against the run's
        (the population size is the record's), before anything starts."""
        data = records[DataPath].params
        if data.agent_policies:  # its episodes give every agent of its env the policy scored
            raise ValueError("the evaluator plays one policy for every agent of an env, but "
                             "agent_policies gives agents of other spaces policies of their own")
        known = range(data.num_policies)
        for policy in (*params.policies, *([params.opponent] if params.opponent >= 0 else [])):
            if policy not in known:
                raise ValueError(f"policy {policy} is not one of the run's policies "
                                 f"0..{len(known) - 1}")
        return []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.player: EpisodePlayer | None = None
        self.scored: dict[int, int] = {}
        """Version of each policy's last evaluation."""
        self.rounds = 0
        self.writers: dict[int, Any] = {}
        """TensorBoard's SummaryWriter of each policy scored, opened at its first score."""
        self.tensorboard: Path | None = None
        """The run's TensorBoard folder; None without a run directory."""
        self._chunk: asyncio.Future[Any] | None = None
        self._loop_task: asyncio.Task[Any] | None = None

    async def on_start(self) -> None:
        """Attach the published weights, make the env (in a thread), start the rounds."""
        p, data = self.params, self.context.records[DataPath].params
        self.seed = data.seed
        torch.set_num_threads(p.torch_threads)
        self.evaluated = list(p.policies or range(data.num_policies))
        ids = sorted({*self.evaluated, *([p.opponent] if p.opponent >= 0 else [])})
        self.weights = {i: self._attach(i) for i in ids}
        self.models = {i: build_policy(data).prepare_for_inference() for i in ids}
        for i in ids:
            if self.weights[i].weights.numel() != flat_size(self.models[i].published_tensors()):
                raise ValueError(f"{weights_name(i)} does not fit this model: the learner and "
                                 f"the evaluator disagree on env or model settings")
        # the run's env frames, where a statistics actor keeps them
        stats = self.context.table.topology.actors_of(Stats)
        totals = totals_name(stats[0].spec.name) if stats else None
        self.totals = (self.context.shared(totals).numpy
                       if totals in self.context.array_specs else None)
        run_dir = self.context.run_dir
        self.jsonl = None if run_dir is None else Path(run_dir, "evaluation.jsonl")
        self.tensorboard = None if run_dir is None else Path(run_dir, "tensorboard")
        self._declare_metrics()
        self.make_env = lambda: bound_actions(make_env(data.env, **data.env_kwargs),
                                              data.model.action_bounds)
        self.player = await self._in_thread(
            lambda: EpisodePlayer(self.make_env(), data.state_size, p.deterministic))
        self._loop_task = self.spawn(self._rounds(), "evaluation rounds")

    def _attach(self, policy: int) -> PolicyWeights:
        if weights_name(policy) not in self.context.array_specs:
            raise ValueError(f"no learner publishes policy {policy}: nothing to evaluate")
        return PolicyWeights(self.context, policy)

    def _declare_metrics(self) -> None:
        labels, family = ("actor", "policy"), self.metrics
        self.m_reward = family.gauge_family("sfbus_evaluator_episode_reward",
                                            "Mean return of the last evaluation", labels)
        self.m_reward_std = family.gauge_family(
            "sfbus_evaluator_episode_reward_std",
            "Standard deviation of the returns of the last evaluation", labels)
        self.m_length = family.gauge_family(
            "sfbus_evaluator_episode_length",
            "Mean episode length (env steps) of the last evaluation", labels)
        self.m_version = family.gauge_family("sfbus_evaluator_policy_version",
                                             "Weights version of the last evaluation", labels)
        self.m_evaluations = family.counter_family("sfbus_evaluator_evaluations_total",
                                                   "Evaluations finished", labels)

    async def _rounds(self) -> None:
        """Start a round now and every ``interval_s`` seconds; a late round starts the next at
        once. The first scores the weights the run starts from (fresh or resumed)."""
        interval = self.params.interval_s
        next_at = time.monotonic()
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            try:
                await self.evaluate_round()
            except Exception as error:  # logged and reported; the next round tries again
                self.report_failure("evaluation round", error)
            next_at = max(next_at + interval, time.monotonic())

    async def evaluate_round(self) -> list[Score]:
        """Evaluate every policy with new enough weights; report and return their scores."""
        p = self.params
        seed = int(np.random.SeedSequence([self.seed, _SEED_SALT, self.rounds])
                   .generate_state(1)[0])
        scores = []
        try:
            for policy in self.evaluated:
                version, last = self.weights[policy].version, self.scored.get(policy)
                if version == 0 or (last is not None and version - last < p.min_new_versions):
                    continue  # not published yet, or already scored
                score = await self._score(policy, seed)
                if score is not None:
                    self._report(score)
                    scores.append(score)
        finally:
            self.rounds += 1  # a failed round too: the next one plays other episodes
            for writer in self.writers.values() if scores else ():
                writer.flush()
        return scores

    async def _score(self, policy: int, seed: int) -> Score | None:
        """Play ``episodes`` episodes with the latest weights of ``policy`` (None if the env
        broke: it is recreated and the policy waits for the next round)."""
        p, player = self.params, self.player
        assert player is not None
        started, wall = time.perf_counter(), time.time()
        frames = 0 if self.totals is None else int(self.totals[0])
        model = self.models[policy]
        version = model.read_weights(self.weights[policy])
        if p.opponent >= 0:
            opponent = self.models[p.opponent]  # the same object when it is ``policy``
            if p.opponent != policy:
                opponent.read_weights(self.weights[p.opponent])
            players, counted = [model] + [opponent] * (player.spec.num_agents - 1), [0]
        else:
            players, counted = [model] * player.spec.num_agents, range(player.spec.num_agents)
        try:
            player.start(players, counted, seed)
            while len(player.episodes) < p.episodes:
                await self._in_thread(player.play, _CHUNK_STEPS, p.episodes)
        except EnvError as error:
            self.log.warning("%s: env failed evaluating policy %d (%s); recreating it",
                             self.name, policy, error)
            await self._in_thread(player.renew, self.make_env)
            return None
        self.scored[policy] = version
        episodes = player.episodes[:p.episodes]
        return Score(policy, version, self.rounds, frames, wall,
                     [e.episode_return for e in episodes], [e.length for e in episodes],
                     [e.true_return for e in episodes], time.perf_counter() - started)

    def _report(self, score: Score) -> None:
        """Metrics, a log line, a JSON record and TensorBoard scalars of one score."""
        p = self.params
        record = score.record(self.name, p.deterministic, p.opponent)
        labels = (self.name, str(score.policy))
        self.m_reward.labels(*labels).set(record["mean_return"])
        self.m_reward_std.labels(*labels).set(record["std_return"])
        self.m_length.labels(*labels).set(record["mean_length"])
        self.m_version.labels(*labels).set(score.version)
        self.m_evaluations.labels(*labels).inc()
        self.log.info("%s: policy %d version %d at %d frames: return %.2f +- %.2f over %d %s "
                      "episodes (%.1f s)", self.name, score.policy, score.version,
                      score.env_frames, record["mean_return"], record["std_return"],
                      record["episodes"], "deterministic" if p.deterministic else "sampled",
                      score.seconds)
        if self.jsonl is not None:
            with self.jsonl.open("a") as file:
                file.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self._write_scalars(score.policy, record, score.env_frames)

    def _write_scalars(self, policy: int, record: dict[str, Any], env_frames: int) -> None:
        """One score in the policy's TensorBoard run of this evaluator, under training's tags."""
        assert self.tensorboard is not None and self.player is not None
        if policy not in self.writers:
            from torch.utils.tensorboard import SummaryWriter  # loads tensorboard: only when used

            self.writers[policy] = SummaryWriter(str(self.tensorboard / str(policy) / self.name))
        frameskip = self.player.env.spec.frameskip  # Sample Factory's len counts env frames
        for tag, value in (("reward/reward", record["mean_return"]),
                           ("reward/reward_min", record["min_return"]),
                           ("reward/reward_max", record["max_return"]),
                           ("len/len", record["mean_length"] * frameskip),
                           ("policy_stats/avg_true_objective",
                            record.get("mean_true_return", record["mean_return"]))):
            self.writers[policy].add_scalar(tag, value, env_frames)

    async def _in_thread(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        # Shielded: a stop cancels the rounds but must wait for the thread, which uses the env.
        self._chunk = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
        return await asyncio.shield(self._chunk)

    async def on_stop(self) -> None:
        """Cancel the rounds, wait for the chunk in flight, close the env and the event file."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.wait({self._loop_task})
        if self._chunk is not None and not self._chunk.done():
            await asyncio.wait({self._chunk})
        if self.player is not None:
            self.player.env.close()
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
