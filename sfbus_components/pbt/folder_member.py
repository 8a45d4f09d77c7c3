"""A run's part in a population across machines: PBT through a shared folder, no central process.

Each member of such a population is an ordinary run (its own processes, its own learner or
DD-PPO ranks) with one :class:`SharedFolderPbt` actor for its policy. The actor:

- keeps the policy's objective from ``EpisodeFinished`` and its frames from ``TrainingStats``
  (the in-run PBT's :class:`~sfbus_components.pbt.rules.Population`);
- every ``publish_every_s`` copies the learner's newest checkpoint
  (``RUN_DIR/checkpoints/policy_<p>/``) and then its record into ``<folder>/<member>/``
  (:mod:`sfbus_components.pbt.shared_folder`);
- every ``interval`` frames decides by itself, with the in-run rules
  (:func:`~sfbus_components.pbt.rules.decide`), against the members whose records are fresh and
  who had an objective at equal or fewer frames. To exploit a better member it copies that
  member's published checkpoint into its run's snapshot folder for a new exchange number and sends
  its learner ``ReplacePolicy(own policy, FOLDER_SOURCE, exchange)``: the learner takes it as a
  snapshot written by a source policy (no learner of this run is policy ``FOLDER_SOURCE``, so none
  writes one) and loads it whole between two training steps; then ``HyperparamsChanged`` with the
  copied and mutated hyperparameters.

Decisions go to ``RUN_DIR/pbt_history.jsonl`` (as in the in-run PBT, ``member`` and ``peers``
added); the state to ``RUN_DIR/checkpoints/pbt/``: ``sfbus run ... --resume RUN_DIR`` brings the
member back with its hyperparameters and schedule, and its next record makes it visible again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sfbus import Actor, ArraySpec, RunRecords, Seconds, Signal, Topology, slot
from sfbus_components.datapath.messages import (
    EpisodeFinished,
    HyperparamsChanged,
    PolicyReplaced,
    ReplacePolicy,
    TrainingStats,
)
from sfbus_components.datapath.record import DataPath
from sfbus_components.learning.checkpoint import (
    checkpoint_path,
    config_fingerprint,
    latest_checkpoint,
    load_newest,
    save_checkpoint,
)
from sfbus_components.learning.distributed import group_from_env
from sfbus_components.learning.population_member import prune_snapshots, snapshot_dir
from sfbus_components.pbt.rules import PbtRules, Population, mutate
from sfbus_components.pbt.shared_folder import (
    MemberDecision,
    MemberRecord,
    SharedFolder,
    add_to_history,
    decide_member,
    write_atomically,
)
from sfbus_components.pbt.trainer import (
    PopulationTrainer,
    env_shaping,
    initial_hyperparams,
    population_learners,
)

FOLDER_SOURCE = -1
"""The source of a weight exchange from the shared folder: no policy of this run."""
_STATE_KEYS = ("hyperparams", "last_update", "frames", "returns", "next_exchange", "updates",
               "rng", "history")


def member_name(configured: str, run_dir: str) -> str:
    """The member's name: ``configured``, else ``task_<SLURM_ARRAY_TASK_ID>`` in a Slurm array
    job, else the run directory's name."""
    if configured:
        return configured
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"task_{task}" if task else Path(run_dir).resolve().name


class SharedFolderPbt(Actor):
    """One policy of this run as a member of a population that shares a folder."""

    component = "pbt"
    records = (DataPath,)

    @dataclass(frozen=True)
    class Params(PopulationTrainer.Params):
        """The in-run PBT's settings (schedule, objective, mutable names) plus the folder's."""

        population_folder: str = ""
        """The folder every member reads and writes (NFS or any shared file system; '': the
        folder ``population`` beside the run directory, so members whose run directories share
        a parent share it)."""
        population_member: str = ""
        """This member's name ('': ``task_$SLURM_ARRAY_TASK_ID``, else the run dir's name)."""
        policy: int = 0
        """The policy of this run that is the member."""
        staleness_s: Seconds = 600.0
        """A member whose record is older than this is left out (it stopped or crashed)."""
        publish_every_s: Seconds = 30.0
        """Seconds between two records (and checkpoint copies) of this member."""
        history_length: int = 100
        """(frames, objective) pairs a record keeps, for the peers' ranking at their frames
        (thinned to span the whole run)."""

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.history_length < 2:
                raise ValueError(f"history_length must be >= 2, got {self.history_length}")

    hyperparams_changed = Signal(HyperparamsChanged, "the member's PBT-managed hyperparameters")
    replace_policy = Signal(ReplacePolicy, "the member copies a peer's checkpoint")

    @classmethod
    def shared_arrays(cls, name: str, params: Any, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """None; refuses a member trained by DD-PPO ranks (each rank would decide alone and
        copy weights into its own learner only, and the ranks' weights would part)."""
        group = group_from_env()
        if group is not None:
            raise ValueError(f"a population member cannot train with DD-PPO ranks yet (WORLD_SIZE "
                             f"{group.world_size}): run each member on one node")
        return []

    async def on_start(self) -> None:
        """Read the initial hyperparameters, resume this run's PBT state, publish, schedule."""
        p, data = self.params, self.context.records[DataPath].params
        if self.context.run_dir is None:
            raise ValueError(f"{self.name}: a population member needs a run directory")
        self.run_dir = Path(self.context.run_dir)
        learner = population_learners(self.context.table.topology, data.num_policies)[p.policy]
        initial = initial_hyperparams(p.mutable, learner, env_shaping(data, p.mutable))
        rules = PbtRules(**{f.name: getattr(p, f.name) for f in dataclasses.fields(PbtRules)})
        folder = p.population_folder or self.run_dir.resolve().parent / "population"
        self.folder = SharedFolder(folder, member_name(p.population_member, str(self.run_dir)),
                                   p.staleness_s, p.keep_checkpoints)
        # members share the seed setting: their name makes their draws differ
        rng = np.random.default_rng([data.seed, zlib.crc32(self.folder.member.encode())])
        self.population = Population({p.policy: initial}, rules, rng, p.objective,
                                     p.objective_episodes)
        self.config = config_fingerprint(data.env, data.model)
        self.pending: int | None = None
        """The exchange in flight (its snapshot copied, the learner not done yet)."""
        self.history: tuple[tuple[int, float], ...] = ()
        self.state_dir = self.run_dir / "checkpoints" / "pbt"
        newest = load_newest(self.state_dir, required=_STATE_KEYS, kind="PBT", log=self.log)
        if newest is not None:
            self.population.restore(newest[1])
            self.history = tuple((int(f), float(o)) for f, o in newest[1]["history"])
            self.log.info("%s: resumed from %s", self.name, newest[0])
        elif rules.initial_mutation:  # each member starts elsewhere: the population is diverse
            values = self.population.hyperparams[p.policy]
            mutations = mutate(values, self.population.defaults[p.policy], rules, rng)
            self._record({"event": "initial_mutation", "mutations": {
                n: list(v) for n, v in mutations.items()}, "hyperparams": values})
        own = self.folder.read_own()
        if own is not None and newest is None and time.time() - own.written <= p.staleness_s:
            self.log.warning("%s: member %r wrote its record %.0f s ago from another run "
                             "directory; two runs with one member name overwrite each other",
                             self.name, own.member, time.time() - own.written)
        self.record = MemberRecord(self.folder.member, 0, None, dict(initial), self.config,
                                   version=0 if own is None else own.version)
        self._deciding = False
        self._next_read = 0.0
        """Monotonic time before which a due decision does not read the folder again."""
        self.view: set[str] = set()
        """The peers of the last read (fresh records)."""
        self._announce()
        await self._publish()
        self.every(p.publish_every_s, self._publish, "publishing to the population folder")
        self.log.info("%s: member %r of the population in %s; decides every %s frames",
                      self.name, self.folder.member, self.folder.folder, f"{p.interval:,}")

    # ----- inputs ----------------------------------------------------------------------------

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Add an episode of this member's policy to its objective."""
        self.population.add_episode(msg.policy, msg.episode_return, msg.true_return, msg.win)

    @slot
    async def on_training_stats(self, msg: TrainingStats) -> None:
        """Count the policy's frames; decide when due (reads the peers' records)."""
        policy = self.params.policy
        if msg.policy != policy:
            return
        self.population.frames[policy] = max(self.population.frames[policy], msg.env_frames)
        if self._deciding or self.pending is not None or not self.population.due(policy) \
                or time.monotonic() < self._next_read:
            return
        # a decision that waits (no peer yet) retries at most once a second, not every step
        self._next_read = time.monotonic() + 1.0
        self._deciding = True
        try:
            await self._decide()
        finally:
            self._deciding = False

    @slot
    def on_policy_replaced(self, msg: PolicyReplaced) -> None:
        """Record the learner's load of a copied checkpoint (or its failure)."""
        if msg.source != FOLDER_SOURCE or msg.exchange != self.pending:
            return
        self.pending = None
        if msg.ok:  # the old network's episodes no longer describe the policy
            self.population.returns[self.params.policy].clear()
        prune_snapshots(self.run_dir, self.params.keep_checkpoints, set())
        self.log.info("%s: exchange %d %s: the learner now trains the copy as version %d",
                      self.name, msg.exchange, "done" if msg.ok else "FAILED", msg.version)
        self._record({"event": "exchange_done" if msg.ok else "exchange_failed",
                      "exchange": msg.exchange, "version": msg.version})

    # ----- deciding --------------------------------------------------------------------------

    async def _decide(self) -> None:
        policy = self.params.policy
        frames = self.population.frames[policy]
        peers = await asyncio.to_thread(self.folder.peers)
        self._see(set(peers))
        made = decide_member(self.folder.member, frames,
                             self.population.objectives().get(policy),
                             self.population.hyperparams[policy], peers, self.config,
                             self.population.rules, self.population.rng,
                             self.population.defaults[policy])
        decision = made.decision
        if decision.rank is None:
            return  # no objective yet, or no peer to compare with: again at the next step
        self.population.last_update[policy] = frames
        self.population.updates += 1
        exchange = None
        if made.source is not None:
            exchange = await self._fetch(made.source)
            if exchange is None:
                return  # the peer's checkpoint went away: keep everything until the next time
        self.population.hyperparams[policy] = dict(decision.hyperparams)
        if exchange is not None:  # weights first, then hyperparameters, as the in-run PBT
            self.pending = exchange
            self.replace_policy.emit(ReplacePolicy(policy, FOLDER_SOURCE, exchange))
        if decision.changed:
            self._announce()
        self._log_decision(made, exchange)
        self._save()

    def _see(self, peers: set[str]) -> None:
        """Log and record the members that joined or left this member's view."""
        joined, left = sorted(peers - self.view), sorted(self.view - peers)
        self.view = peers
        if joined or left:
            self.log.info("%s: members joined %s, left %s (no record for %.0f s); %d in view",
                          self.name, joined, left, self.params.staleness_s, len(peers))
            self._record({"event": "view", "joined": joined, "left": left,
                          "peers": sorted(peers)})

    async def _fetch(self, record: MemberRecord) -> int | None:
        """Copy ``record``'s checkpoint into this run's snapshot folder of a new exchange; its
        number, None if the file is gone (its member pruned or removed it)."""
        existing = [int(d.name.removeprefix("exchange_"))
                    for d in snapshot_dir(self.run_dir, 0).parent.glob("exchange_*")]
        exchange = max([self.population.next_exchange - 1, *existing]) + 1
        self.population.next_exchange = exchange + 1
        source = self.folder.checkpoint_of(record)
        target = snapshot_dir(self.run_dir, exchange)
        try:
            await asyncio.to_thread(_copy_whole, source, checkpoint_path(target, record.version))
        except OSError as error:
            self.log.warning("%s: cannot copy member %r's checkpoint %s: %s", self.name,
                             record.member, source, error)
            return None
        return exchange

    # ----- outputs ---------------------------------------------------------------------------

    async def _publish(self) -> None:
        """Copy the learner's newest checkpoint and write the record (on a thread)."""
        policy = self.params.policy
        frames = self.population.frames[policy]
        objective = self.population.objectives().get(policy)
        if objective is not None and (not self.history or frames > self.history[-1][0]):
            self.history = add_to_history(self.history, (frames, objective),
                                          self.params.history_length)
        newest = latest_checkpoint(self.run_dir / "checkpoints" / f"policy_{policy}")
        record = dataclasses.replace(self.record, frames=frames, objective=objective,
                                     hyperparams=dict(self.population.hyperparams[policy]),
                                     history=self.history)
        try:
            self.record = await asyncio.to_thread(self.folder.publish, record, newest)
        except OSError as error:  # the learner pruned it meanwhile, the folder is away: retry
            self.log.warning("%s: cannot publish to %s: %s", self.name, self.folder.own, error)
        self._save()  # with each record: a member that crashes resumes its history too

    def _save(self) -> None:
        """This run's PBT state, numbered by the record's version (it only grows)."""
        save_checkpoint(self.state_dir, self.state(), self.record.version,
                        self.params.keep_checkpoints)

    def _announce(self) -> None:
        values = self.population.hyperparams[self.params.policy]
        names = tuple(sorted(values))
        self.hyperparams_changed.emit(HyperparamsChanged(self.params.policy, names,
                                                         tuple(values[n] for n in names)))

    def _log_decision(self, made: MemberDecision, exchange: int | None) -> None:
        decision = made.decision
        changes = ", ".join(f"{n} {a:.4g} -> {b:.4g}" for n, (a, b) in decision.mutations.items())
        self.log.info("%s: member %r at %s frames (objective %s): %s%s", self.name,
                      self.folder.member, f"{decision.frames:,}", f"{decision.objective:.4g}",
                      decision.reason, f" ({changes})" if changes else "")
        self._record({
            "event": "exchange" if exchange is not None else "mutation" if decision.mutations
            else "keep", "member": self.folder.member, "frames": decision.frames,
            "objective": decision.objective, "rank": decision.rank,
            "population": decision.population,
            "source": None if made.source is None else made.source.member, "exchange": exchange,
            "peers": {n: list(at) for n, at in made.compared.items()}, "reason": decision.reason,
            "mutations": {n: list(v) for n, v in decision.mutations.items()},
            "hyperparams": decision.hyperparams})

    def _record(self, entry: dict[str, Any]) -> None:
        with Path(self.run_dir, "pbt_history.jsonl").open("a") as out:
            out.write(json.dumps({"time": round(time.time(), 3), **entry}) + "\n")

    def state(self) -> dict[str, Any]:
        """The member's PBT checkpoint: the population's state and its record's history."""
        return {**self.population.state(), "history": [list(h) for h in self.history]}

    async def on_stop(self) -> None:
        """Write the final state and record."""
        if hasattr(self, "record"):
            await self._publish()


def _copy_whole(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` so that ``target`` appears whole (the learner takes the
    first checkpoint it sees in the snapshot folder)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as data:
        write_atomically(target, lambda out: shutil.copyfileobj(data, out, 1 << 20))
