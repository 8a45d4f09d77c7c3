"""The data path's run record: sizes, layouts and names, computed once when a run is launched.

The rollout and inference workers and the learners list :class:`DataPath` in their ``records``
(a batcher reads it when the run has one: a test's feeder makes a run without); the launcher
computes it once from the topology (building the env's spec and one policy to count its
weights; with ``agent_policies`` one per policy, from its agents' own spec), ``run.json`` keeps
it, and each actor reads it from ``context.records[DataPath]`` (or the ``records`` of
``shared_arrays``) instead of deriving it again from the topology. A restarted process reads the
same record.

The data path's parameters are the rollout actor's: the topology's one
:class:`TrajectoryWriter` (found by class, :meth:`sfbus.Topology.actors_of`), whose buffers are the
data path. The record holds them once (:attr:`DataPath.params`), so the inference worker, the
batcher, the learner, the evaluator and the PBT trainer read env, model, sizes and seed from it
and their own ``Params`` keep only their own knobs. The shared arrays' names are spelled in
:mod:`sfbus_components.datapath.buffers` only.
"""

from __future__ import annotations

from sfbus import Actor, RunRecord, Topology
from sfbus_components.datapath.buffers import TrajectoryLayout, trajectory_layout
from sfbus_components.datapath.settings import DataPathParams, data_path_params, published_size
from sfbus_components.envs import EnvSpec


class TrajectoryWriter(Actor):
    """The data path's writing side: an actor each of whose replicas fills one trajectory buffer
    (the rollout worker of :mod:`sfbus_components.sampling`); its ``Params`` are
    :class:`DataPathParams`. A run's :class:`DataPath` is sized from the topology's one such
    actor."""


class DataPath(RunRecord, frozen=True):
    """What every data-path actor of a run agrees on, computed once at launch."""

    layout: TrajectoryLayout
    """Every rollout worker's trajectory buffer: env spec, T, state width, slot counts."""
    workers: tuple[str, ...]
    """The rollout workers' actor instance names, in worker-index order."""
    weights: tuple[int, ...]
    """Floats in each policy's published weights vector (model and normalizer), by policy id."""
    params: DataPathParams
    """The run's data-path parameters (env, model, sizes, seed, population size), as the
    rollout actor was given them: the one place the other actors read them from."""

    @property
    def spec(self) -> EnvSpec:
        """The environment's spec (observation fields, actions, agents, frameskip)."""
        return self.layout.spec

    def policy_spec(self, policy: int) -> EnvSpec:
        """The spec of the agents ``policy`` acts for (with ``agent_policies``, their own
        spaces; else the env's), from which its model is built."""
        return self.layout.of_policy(policy).spec

    def weights_size(self, policy: int) -> int:
        """Floats in the weights vector of ``policy`` (``ValueError`` for a policy the run has
        not)."""
        if not 0 <= policy < len(self.weights):
            raise ValueError(f"policy {policy} does not exist: the run trains policies "
                             f"0..{len(self.weights) - 1} (settings.num_policies)")
        return self.weights[policy]

    @classmethod
    def from_topology(cls, topology: Topology) -> DataPath:
        """The record of ``topology``'s rollout actor (``ValueError`` when it has none)."""
        params, workers = _rollout_actor(topology)
        layout = trajectory_layout(params, len(workers))
        if layout.policy_specs:  # heterogeneous agents: each policy's network its own shape
            weights = tuple(published_size(params, p) for p in range(params.num_policies))
        else:  # one model is built for all policies: they share one network shape
            weights = (published_size(params),) * params.num_policies
        return cls(layout, workers, weights, data_path_params(params))


def _rollout_actor(topology: Topology) -> tuple[DataPathParams, tuple[str, ...]]:
    """The rollout actor's parameters and its instance names, in worker-index order."""
    writers = topology.actors_of(TrajectoryWriter)
    if len(writers) != 1:
        names = ", ".join(f"'{w.spec.name}'" for w in writers) or "none"
        raise ValueError(f"the data path takes one rollout actor (a {TrajectoryWriter.__name__}"
                         f" subclass); the topology has {names}")
    return writers[0].spec.params, writers[0].instances
