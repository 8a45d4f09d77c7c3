"""The league actor: snapshots the trained policies, serves them back as frozen opponents, and
rates every player from the match results.

It reads each trained policy's published weights (``policy.<id>.weights``, the learner's
seqlock vector) and appends them to the snapshot store (:mod:`sfbus_components.league.store`,
``RUN_DIR/league/``) at the policy's first training step, every ``snapshot_every`` of its env
frames, and whenever its win rate over its last ``win_rate_matches`` matches against snapshots
reaches ``win_rate_threshold``. The run's ``opponent_slots`` are extra policy ids after the
trained ones; the league owns their weights vectors and loads a snapshot into a slot by
publishing the snapshot's vector there as the slot's next version, which the inference workers
pick up as they do a learner's (no process, no learner, no batcher per snapshot; only the
snapshots in slots are resident). Every ``rotate_every_s`` it draws the slots' snapshots afresh
from the pool (the newest ``pool_size``, all when 0) with the topology's weighting
(:mod:`sfbus_components.league.opponents`); the rollout workers' mapping
(:mod:`sfbus_components.league.mapping`) gives each match its opponent. With
``fixed_opponents`` the slots hold those files for the whole run instead (a best response to
them), rated as players ``fixed:<i>``.

Each ``EpisodeFinished`` with an opponent is one side of a match; the league records it once,
from the side of the lower policy id when that is a trained policy, into the payoff table and
the Elo ratings (:mod:`sfbus_components.league.ratings`); an opponent slot counts as the
snapshot it held at the weights version the match was played with
(:mod:`sfbus_components.league.slot_history`): a match across a slot's reload, and one against an
empty slot (a fresh network, before the first snapshot), are not rated.
Every ``report_every_s`` the ratings go to Prometheus (``sfbus_league_rating{player}``, by
role: ``policy:<id>``, ``newest_snapshot:<id>``, ``slot:<k>``),
TensorBoard (``RUN_DIR/tensorboard/league``), PBT (``LeagueRatings``) and
``RUN_DIR/league/state.json`` (written atomically; a resumed run continues from it).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from sfbus import (
    Actor,
    ArraySpec,
    Interval,
    Range,
    RunRecords,
    Signal,
    Topology,
    import_object,
    slot,
)
from sfbus_components.datapath.buffers import PolicyWeights, policy_array_specs
from sfbus_components.datapath.messages import (
    EpisodeFinished,
    LeagueRatings,
    PolicyReplaced,
    TrainingStats,
)
from sfbus_components.datapath.record import DataPath, TrajectoryWriter
from sfbus_components.datapath.settings import build_policy
from sfbus_components.league.mapping import LeagueMapping
from sfbus_components.league.opponents import Weighting, draw_residents, opponent_probabilities
from sfbus_components.league.ratings import Payoff, policy_player, snapshot_player
from sfbus_components.league.slot_history import SlotHistory
from sfbus_components.league.store import SnapshotStore, load_opponent

STATE = "state.json"


class League(Actor):
    """Snapshots, frozen opponents in the run's opponent slots, payoff table and ratings."""

    component = "league"
    records = (DataPath,)

    @dataclass(frozen=True)
    class Params:
        """The league's knobs; population size and opponent slots are the data path's."""

        snapshot_every: Annotated[int, Range(1, 1e15)] = 1_000_000
        """A policy's env frames between two of its snapshots."""
        win_rate_threshold: Annotated[float, Range(0.0, 1.0)] = 0.7
        """A policy whose win rate against snapshots over its last ``win_rate_matches`` matches
        reaches this is snapshotted at once (it has outgrown the pool)."""
        win_rate_matches: Annotated[int, Range(1, 1e6)] = 50
        """Matches against snapshots in that win rate."""
        opponent_sampling: Weighting = "pfsp_hard"
        """How the slots' snapshots are drawn from the pool: ``uniform``, ``pfsp_hard``
        (weight ``(1 - x)^2`` of the learners' win rate ``x``) or ``pfsp_variance``
        (``x (1 - x)``)."""
        pool_size: Annotated[int, Range(0, 1e6)] = 0
        """The newest snapshots opponents are drawn from (0: the whole store)."""
        rotate_every_s: Interval = 30.0
        """Seconds between two draws of the slots' snapshots."""
        elo_k: Annotated[float, Range(0.0, 1e4)] = 16.0
        """Elo's K: rating points a result moves, times (score - expected)."""
        report_every_s: Interval = 5.0
        """Seconds between reports of the ratings (and saves of the state)."""
        fixed_opponents: tuple[str, ...] = ()
        """Files the opponent slots hold for the whole run instead of the store's draws, slot
        ``k`` the file ``k mod n``: league snapshots or learner checkpoints of the same env and
        model (training a best response to them); rated as players ``fixed:<i>``."""

    league_ratings = Signal(LeagueRatings, "a policy's rating and its newest snapshot's")

    @classmethod
    def shared_arrays(cls, name: str, params: Params, topology: Topology,
                      records: RunRecords) -> list[ArraySpec]:
        """The opponent slots' weights vectors, which this actor writes; checks before anything
        starts that the run has slots and a mapping that assigns them."""
        data_path = records[DataPath]
        data = data_path.params
        if data.opponent_slots < 1:
            raise ValueError("the league serves its snapshots in opponent slots: set "
                             "settings.opponent_slots >= 1")
        mapping = topology.actors_of(TrajectoryWriter)[0].spec.params.policy_mapping
        if not (isinstance(cls_ := import_object(mapping), type)
                and issubclass(cls_, LeagueMapping)):
            raise ValueError(f"the league's opponent slots need its policy mapping; "
                             f"policy_mapping is {mapping!r}, set "
                             f"'sfbus_components.league.mapping:LeagueMapping'")
        for file in params.fixed_opponents:  # read once here: a bad file is refused at launch
            try:
                load_opponent(file, build_policy(data))
            except ValueError as error:
                raise ValueError(f"fixed_opponents: {file}: {error}") from None
        size = data_path.weights_size(0)
        return [spec for s in range(data.opponent_slots)
                for spec in policy_array_specs(data.num_policies + s, size)]

    async def on_start(self) -> None:
        """Open the store, resume the state, attach the weights, fill the slots."""
        p, data = self.params, self.context.records[DataPath].params
        if self.context.run_dir is None:
            raise ValueError("the league keeps its snapshots in the run directory; run with one")
        self.folder = Path(self.context.run_dir, "league")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.store = SnapshotStore(self.folder)
        self.trained = data.num_policies
        self.size = self.context.records[DataPath].weights_size(0)
        self.published = {i: PolicyWeights(self.context, i) for i in range(self.trained)}
        self.slots = [PolicyWeights(self.context, self.trained + s)
                      for s in range(data.opponent_slots)]
        self.resident: list[int | None] = [None] * data.opponent_slots
        """The snapshot in each opponent slot (None: empty, a fresh network)."""
        self.history = SlotHistory(data.opponent_slots)
        self.cache: dict[int, torch.Tensor] = {}
        """The weights of the resident snapshots (only those)."""
        self.rng = np.random.default_rng([data.seed, 0x1EA6])
        self.frames = dict.fromkeys(range(self.trained), 0)
        self.recent: dict[int, deque[float]] = {i: deque(maxlen=p.win_rate_matches)
                                                for i in range(self.trained)}
        self.payoff = Payoff(p.elo_k)
        self._resume()
        for policy in range(self.trained):
            self.payoff.add_player(policy_player(policy))
        for snapshot in self.store.snapshots:  # one the state was not saved after (a crash)
            self.payoff.add_player(snapshot_player(snapshot.snapshot))
        family = self.metrics
        self.m_rating = family.gauge_family(
            "sfbus_league_rating", "Elo rating of a league player: policy:<id> (as it trains), "
            "newest_snapshot:<id> (its newest snapshot), slot:<k> (the snapshot in slot k)",
            ("player",))
        self.m_snapshots = self.metrics.gauge("snapshots", "Snapshots in the store")
        self.m_matches = self.metrics.counter("matches", "Matches recorded in the payoff table")
        self.m_loads = self.metrics.counter("slot_loads", "Snapshots loaded into opponent slots")
        self.m_snapshots.set(len(self.store))
        self.writer: Any = None
        self.fixed = [self._vector_of(file) for file in p.fixed_opponents]
        """The fixed opponents' weights vectors (none: the slots hold the store's draws)."""
        if self.fixed:
            self._load_fixed()
        else:
            self._rotate()
            self.every(p.rotate_every_s, self._rotate, "opponent draw")
        self.every(p.report_every_s, self._report, "ratings report")
        self.log.info("%s: %d snapshots in %s; %d opponent slots, drawn %s", self.name,
                      len(self.store), self.folder, len(self.slots), p.opponent_sampling)

    def _resume(self) -> None:
        """Continue from ``state.json`` when a previous run left one."""
        path = self.folder / STATE
        if not path.exists():
            return
        state = json.loads(path.read_text())
        self.payoff = Payoff.from_state(state["payoff"], self.params.elo_k)
        self.frames.update({int(k): int(v) for k, v in state["frames"].items()})
        for policy, scores in state["recent"].items():
            if int(policy) in self.recent:  # the run may train fewer policies now
                self.recent[int(policy)].extend(scores)
        self.rng.bit_generator.state = state["rng"]
        self.log.info("%s: resumed %d matches, %d players", self.name, self.payoff.matches,
                      len(self.payoff.ratings))

    # ----- inputs ----------------------------------------------------------------------------

    @slot
    def on_training_stats(self, msg: TrainingStats) -> None:
        """Snapshot a policy at its first training step and every ``snapshot_every`` frames."""
        if msg.policy not in self.published:
            return
        self.frames[msg.policy] = max(self.frames[msg.policy], msg.env_frames)
        newest = self.store.newest(msg.policy)
        if newest is None:
            self._snapshot(msg.policy, "first")
        elif msg.env_frames - newest.env_frames >= self.params.snapshot_every:
            self._snapshot(msg.policy, "frames")

    @slot
    def on_episode_finished(self, msg: EpisodeFinished) -> None:
        """Record a match once, from its lower policy id's side when that one trains."""
        if msg.opponent < 0 or msg.policy >= self.trained or msg.policy >= msg.opponent:
            return  # no match, the frozen side's report, or the other side's of this match
        if msg.win not in (0.0, 0.5, 1.0):  # NaN: the env reports no outcome
            return
        if msg.opponent < self.trained:
            opponent = policy_player(msg.opponent)
        elif (held := self.history.player(msg.opponent - self.trained,
                                          msg.opponent_versions)) is not None:
            opponent = held
        else:
            return  # an empty slot (a fresh network), or a reload during the match
        self.payoff.record(policy_player(msg.policy), opponent, msg.win)
        self.m_matches.inc()
        if msg.opponent >= self.trained:
            recent = self.recent[msg.policy]
            recent.append(msg.win)
            if len(recent) == recent.maxlen \
                    and sum(recent) / len(recent) >= self.params.win_rate_threshold:
                self._snapshot(msg.policy, "win_rate")

    @slot
    def on_policy_replaced(self, msg: PolicyReplaced) -> None:
        """A PBT exchange made ``policy`` a copy of ``source``: it takes the source's rating."""
        if msg.ok and msg.policy in self.published and msg.source in self.published:
            self.payoff.take_rating(policy_player(msg.policy), policy_player(msg.source))

    # ----- the store and the slots -----------------------------------------------------------

    def _snapshot(self, policy: int, reason: str) -> None:
        """Append ``policy``'s published weights to the store; an empty slot takes them."""
        vector = torch.empty(self.size)
        version = self.published[policy].read_into([vector])
        if version == 0:
            return  # nothing published yet
        snapshot = self.store.add(policy, version, self.frames[policy], vector, reason)
        self.payoff.add_player(snapshot_player(snapshot.snapshot),
                               self.payoff.ratings[policy_player(policy)])
        self.recent[policy].clear()
        self.m_snapshots.set(len(self.store))
        self.log.info("%s: snapshot %d of policy %d (version %d, %s frames): %s", self.name,
                      snapshot.snapshot, policy, version, f"{snapshot.env_frames:,}", reason)
        if None in self.resident and not self.fixed:
            self._load(self.resident.index(None), snapshot.snapshot)
        self._save()

    def pool(self) -> list[int]:
        """The snapshots opponents are drawn from: the newest ``pool_size`` (0: all)."""
        ids = [s.snapshot for s in self.store.snapshots]
        return ids[-self.params.pool_size:] if self.params.pool_size else ids

    def _rotate(self) -> None:
        """Draw each slot's snapshot from the pool; reload only the slots that change."""
        pool = self.pool()
        if not pool:
            return
        live = [policy_player(i) for i in range(self.trained)]
        rates = [self.payoff.pooled_win_rate(live, snapshot_player(s)) for s in pool]
        probabilities = opponent_probabilities(rates, self.params.opponent_sampling)
        for index, snapshot in enumerate(draw_residents(pool, probabilities, len(self.slots),
                                                        self.rng)):
            if self.resident[index] != snapshot:
                self._load(index, snapshot)

    def _load(self, index: int, snapshot: int) -> None:
        """Publish ``snapshot``'s weights as opponent slot ``index``'s next version."""
        weights = self.cache.get(snapshot)
        if weights is None:
            weights = self.cache[snapshot] = self.store.weights(snapshot)
        target = self.slots[index]
        version = target.version + 1
        target.publish([weights], version)
        self.history.loaded(index, version, snapshot_player(snapshot))
        self.resident[index] = snapshot
        self.cache = {s: w for s, w in self.cache.items() if s in self.resident}
        self.m_loads.inc()

    def _vector_of(self, file: str) -> torch.Tensor:
        """A fixed opponent's published weights vector."""
        policy = build_policy(self.context.records[DataPath].params)
        load_opponent(file, policy)
        return torch.cat([t.detach().reshape(-1).float() for t in policy.published_tensors()])

    def _load_fixed(self) -> None:
        """Publish the fixed opponents into the slots, for the whole run."""
        for index, target in enumerate(self.slots):
            version, player = target.version + 1, f"fixed:{index % len(self.fixed)}"
            target.publish([self.fixed[index % len(self.fixed)]], version)
            self.history.loaded(index, version, player)
            self.payoff.add_player(player)
            self.m_loads.inc()

    def _player_in(self, index: int) -> str | None:
        """The player opponent slot ``index`` holds (None: empty, a fresh network)."""
        if self.fixed:
            return f"fixed:{index % len(self.fixed)}"
        held = self.resident[index]
        return None if held is None else snapshot_player(held)

    def slots_intact(self) -> list[bool]:
        """Whether each occupied slot still holds its snapshot's (or fixed opponent's) weights
        bit for bit (nothing but the league writes a slot: no learner trains it)."""
        vector = torch.empty(self.size)
        intact = []
        for index, (target, snapshot) in enumerate(zip(self.slots, self.resident, strict=True)):
            expected = self.fixed[index % len(self.fixed)] if self.fixed else (
                None if snapshot is None else self.store.weights(snapshot))
            if expected is not None:
                target.read_into([vector])
                intact.append(bool(torch.equal(vector, expected)))
        return intact

    # ----- reports ---------------------------------------------------------------------------

    def _report(self) -> None:
        """Ratings to Prometheus, TensorBoard and PBT; the state to ``state.json``."""
        ratings = self.payoff.ratings
        # Labels by role, a bounded set (the store grows): every snapshot's rating is in the state
        for index in range(len(self.slots)):
            if (player := self._player_in(index)) is not None:
                self.m_rating.labels(f"slot:{index}").set(ratings[player])
        step = sum(self.frames.values())
        writer = self._tensorboard()
        for policy in range(self.trained):
            newest = self.store.newest(policy)
            own = ratings[policy_player(policy)]
            of_snapshot = math.nan if newest is None else ratings[snapshot_player(newest.snapshot)]
            self.league_ratings.emit(LeagueRatings(policy, own, of_snapshot))
            self.m_rating.labels(policy_player(policy)).set(own)
            self.m_rating.labels(f"newest_snapshot:{policy}").set(of_snapshot)
            writer.add_scalar(f"league/rating_policy_{policy}", own, step)
            if newest is not None:
                writer.add_scalar(f"league/rating_newest_snapshot_{policy}", of_snapshot, step)
        writer.add_scalar("league/snapshots", len(self.store), step)
        writer.add_scalar("league/matches", self.payoff.matches, step)
        writer.flush()
        self._save()

    def _tensorboard(self) -> Any:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter  # loads tensorboard: only when used

            self.writer = SummaryWriter(str(Path(self.context.run_dir, "tensorboard", "league")))
        return self.writer

    def state(self) -> dict[str, Any]:
        """What a resumed league continues from (JSON values)."""
        return {"payoff": self.payoff.state(), "frames": self.frames,
                "recent": {p: list(r) for p, r in self.recent.items()},
                "rng": self.rng.bit_generator.state, "resident": self.resident,
                "snapshots": len(self.store)}

    def _save(self, extra: dict[str, Any] | None = None) -> None:
        """Write ``state.json`` atomically (a temporary file renamed over it)."""
        fd, temp = tempfile.mkstemp(prefix=".state_", suffix=".tmp", dir=self.folder)
        with os.fdopen(fd, "w") as out:
            json.dump({**self.state(), **(extra or {})}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, self.folder / STATE)

    async def on_stop(self) -> None:
        """Save the state with a last check that the slots were never written but by us."""
        if hasattr(self, "payoff"):
            self._save({"slots_intact": self.slots_intact()})
        if getattr(self, "writer", None) is not None:
            self.writer.close()
