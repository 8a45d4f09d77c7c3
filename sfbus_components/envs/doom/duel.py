"""VizDoom multiplayer: k agents (2: a duel) in one networked deathmatch, as a `MultiAgentEnv`.

Each agent plays its own VizDoom instance in a player process (see `match.py`); the host and
the joiners meet over UDP on 127.0.0.1 and step in lock-step. The map is the CIG competition map
(`cig.wad` map01, as doom.py's bot deathmatch), the action space the paper's full multi-head one
and the observations doom.py's: `obs` uint8 `(3, 72, 128)` and `measurements` float32 `(19,)`.

Rewards are frag-based as in Sample Factory's duels: +1 per frag, -1 per death by default
(`reward_shaping` takes any `spaces.SHAPING_TERMS` keys). At an episode's end every agent's
info carries `episode_true_return` (its frags, the match score), `episode_frags`,
`episode_deaths`, `episode_win` (1.0 when it outscored every other agent, else 0.0) and, in a
duel, `episode_opponent` (the other agent's index; the rollout worker reports its policy).

A match whose start or step fails (a player or engine died, an answer took longer than
`step_timeout_s`) is torn down, every process of it killed, and started again on a new port; the
step that saw the failure returns the new match's first observations with every agent's episode
truncated (and not reported: its score means nothing). `restarts` counts this. After
`max_start_attempts` failed starts in a row the env raises `DoomEnvError`, which a rollout
worker answers by recreating the env.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import vizdoom as vzd

from sfbus_components.envs.doom import spaces as ds
from sfbus_components.envs.doom.game import (
    INTERPOLATION,
    DoomEnvError,
    engine_config_path,
    make_engine_home,
)
from sfbus_components.envs.doom.match import RESET, Match, MatchError, PlayerSetup, free_udp_port
from sfbus_components.envs.doom.shm import start_sweeper
from sfbus_components.envs.spec import (
    EnvSpec,
    EpisodeStats,
    MultiAgentEnv,
    ObsDict,
    ObsField,
    StepOutput,
)

log = logging.getLogger(__name__)

V = vzd.GameVariable
DUEL_SHAPING: dict[str, float] = {"frag": 1.0, "frag_lost": -1.0, "death": -1.0}


class DoomDuelEnv(MultiAgentEnv):
    """`num_agents` learning agents (and `num_bots` ZDoom bots) in one networked deathmatch.

    Args: `frameskip` tics per step; `resolution` (width, height) of `obs`; `episode_timeout`
    in tics (4200, deathmatch.cfg's two minutes); `start_timeout_s` for all players to join;
    `step_timeout_s` for one lock-step (below the rollout worker's 10 s step watchdog, so that
    the env restarts its own match first).
    """

    def __init__(self, *, num_agents: int = 2, num_bots: int = 0, frameskip: int = 4,
                 resolution: tuple[int, int] = (128, 72), seed: int | None = None,
                 reward_shaping: dict[str, float] | None = None, interpolation: str = "linear",
                 episode_timeout: int = 4200, start_timeout_s: float = 30.0,
                 step_timeout_s: float = 5.0, max_start_attempts: int = 3) -> None:
        if num_agents < 1 or num_agents + num_bots > 8:
            raise ValueError("a match needs 1..8 players (agents plus bots; 8 CIG map starts)")
        if frameskip < 1:
            raise ValueError(f"frameskip must be >= 1, not {frameskip}")
        if interpolation not in INTERPOLATION:
            raise ValueError(f"interpolation must be one of {sorted(INTERPOLATION)}")
        self.reward_shaping: dict[str, float] = dict(DUEL_SHAPING if reward_shaping is None
                                                     else reward_shaping)
        """Shaping coefficients, read every step: mutate in place (PBT does)."""
        ds.check_shaping_keys(self.reward_shaping, per_step=False)
        self.num_agents = num_agents
        self.restarts = 0
        """Matches torn down and started again after a failure."""
        self._seed = seed
        self._start_timeout_s = start_timeout_s
        self._step_timeout_s = step_timeout_s
        self._max_start_attempts = max_start_attempts
        meas = [m.variable for m in ds.MEASUREMENTS]
        self._vars = list(dict.fromkeys(meas + ds.shaping_variables(ds.SHAPING_TERMS)))
        self._meas_scale = np.array([m.scale for m in ds.MEASUREMENTS])
        self._frag = self._vars.index(V.FRAGCOUNT)
        self._death = self._vars.index(V.DEATHCOUNT)
        w, h = int(resolution[0]), int(resolution[1])
        self._setup = dict(
            num_players=num_agents, cfg="deathmatch.cfg", wad="cig.wad", doom_map="map01",
            buttons=tuple(b.name for b in ds.FULL_BUTTONS),
            variables=tuple(v.name for v in self._vars), frameskip=frameskip, resolution=(w, h),
            interpolation=INTERPOLATION[interpolation], episode_timeout=episode_timeout,
            num_bots=num_bots, connect_timeout_s=max(1, int(start_timeout_s)),
            ini_path=engine_config_path())
        self._heads = _head_matrices()
        self._spec = EnvSpec({"obs": ObsField((3, h, w), "uint8"),
                              "measurements": ObsField((len(ds.MEASUREMENTS),), "float32")},
                             action_heads=ds.FULL_ACTION_HEADS, num_agents=num_agents,
                             frameskip=frameskip)
        self._stats = EpisodeStats(num_agents, frameskip)
        self._prev = np.zeros((num_agents, len(self._vars)))
        self._start = np.zeros((num_agents, len(self._vars)))
        self._match: Match | None = None
        start_sweeper()

    @property
    def spec(self) -> EnvSpec:
        """The env's fixed spec."""
        return self._spec

    @property
    def engine_pids(self) -> list[int]:
        """The current match's VizDoom engine of each agent (index 0 hosts); empty if none."""
        return [] if self._match is None else list(self._match.engine_pids)

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Start new episodes for every agent (starting the match if needed)."""
        if seed is not None and seed != self._seed:
            self._seed = seed
            self._close_match()  # the host's seed is fixed at its start
        if self._match is None:
            self._start_match(obs_out)
            return
        try:
            self._new_episode(obs_out)
        except MatchError as e:
            self._restart(e, obs_out)

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step every agent's game by `frameskip` tics together; reset all at the match's end."""
        if self._match is None:
            raise RuntimeError("call reset() before the first step()")
        n = self.num_agents
        infos: list[dict[str, Any]] = [{} for _ in range(n)]
        try:
            replies = self._match.step(self._buttons(actions), self._spec.frameskip)
            cur = np.stack([header[2:] for header, _ in replies])
            rewards = np.array([ds.shaping_reward(self.reward_shaping, self._as_dict(prev),
                                                  self._as_dict(now))
                                for prev, now in zip(self._prev, cur, strict=True)], np.float32)
            self._prev[:] = cur
            self._stats.add(rewards)
            if not any(header[0] for header, _ in replies):
                self._write_obs(replies, obs_out)
                return rewards, np.zeros(n, bool), np.zeros(n, bool), infos
            timeout = any(header[1] for header, _ in replies)
            self._finish(infos)
            self._new_episode(obs_out)
        except MatchError as e:
            self._restart(e, obs_out)
            # the episode in progress (or the one just reported) ends here, unscored
            return np.zeros(n, np.float32), np.zeros(n, bool), np.ones(n, bool), infos
        return rewards, np.full(n, not timeout), np.full(n, timeout), infos

    def abort(self) -> None:
        """Kill the match's processes (any thread): a hung step fails and the match restarts."""
        if self._match is not None:
            self._match.abort()

    def close(self) -> None:
        """Close the games and stop every process of the match; safe to call twice."""
        self._close_match(graceful=True)

    # ----- the match -------------------------------------------------------------------------

    def _start_match(self, obs_out: ObsDict) -> None:
        """Start a match and its first episode, retrying on a new port; raise after the last."""
        error: Exception | None = None
        make_engine_home()  # the players' engines start at once, in this process's directory
        for _ in range(self._max_start_attempts):
            port = free_udp_port()
            setups = [PlayerSetup(index=i, port=port, seed=self._seed, **self._setup)
                      for i in range(self.num_agents)]
            try:
                self._match = Match(setups, self._spec.observation_space["obs"].shape,
                                    self._start_timeout_s, self._step_timeout_s)
                self._new_episode(obs_out)
                return
            except MatchError as e:
                error = e
                log.warning("VizDoom match on port %d failed to start (%s); retrying", port, e)
                self._close_match()
        raise DoomEnvError(f"VizDoom match failed to start {self._max_start_attempts} times; "
                           f"last: {error}")

    def _restart(self, error: MatchError, obs_out: ObsDict) -> None:
        self.restarts += 1
        log.warning("VizDoom match failed (%s); restarting it (restart %d)", error, self.restarts)
        self._close_match()
        self._start_match(obs_out)

    def _close_match(self, graceful: bool = False) -> None:
        if self._match is not None:
            self._match.close(graceful)
            self._match = None

    def _new_episode(self, obs_out: ObsDict) -> None:
        assert self._match is not None
        self._match.send(RESET)
        replies = self._match.receive()
        self._prev[:] = np.stack([header[2:] for header, _ in replies])
        self._start[:] = self._prev
        self._stats.clear()
        self._write_obs(replies, obs_out)

    # ----- per step --------------------------------------------------------------------------

    def _buttons(self, actions: np.ndarray) -> list[np.ndarray]:
        """Each agent's button values: the sum over heads of the chosen row of each head."""
        return [sum(m[a] for m, a in zip(self._heads, row.tolist(), strict=True))
                for row in actions]

    def _as_dict(self, values: np.ndarray) -> dict[Any, float]:
        return dict(zip(self._vars, values.tolist(), strict=True))

    def _write_obs(self, replies: list[tuple[np.ndarray, np.ndarray | None]],
                   obs_out: ObsDict) -> None:
        for i, (header, obs) in enumerate(replies):
            if obs is None:
                raise MatchError(f"player {i} sent no screen for a running episode")
            np.copyto(obs_out["obs"][i], obs)
            np.multiply(header[2:2 + len(self._meas_scale)], self._meas_scale,
                        out=obs_out["measurements"][i], casting="unsafe")

    def _finish(self, infos: list[dict[str, Any]]) -> None:
        frags = self._prev[:, self._frag] - self._start[:, self._frag]
        deaths = self._prev[:, self._death] - self._start[:, self._death]
        for i, info in enumerate(infos):
            self._stats.finish(i, info)
            others = np.delete(frags, i)
            info["episode_true_return"] = float(frags[i])
            info["episode_frags"] = float(frags[i])
            info["episode_deaths"] = float(deaths[i])
            info["episode_win"] = float(others.size == 0 or frags[i] > others.max())
            if len(infos) == 2:
                info["episode_opponent"] = 1 - i

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self._close_match()


def _head_matrices() -> list[np.ndarray]:
    """Per action head: a (choices, buttons) matrix whose row sets that choice's button value."""
    table = ds.full_action_table()
    mats = []
    for head in table:
        m = np.zeros((len(head), len(ds.FULL_BUTTONS)))
        for choice, hit in enumerate(head):
            if hit is not None:
                m[choice, hit[0]] = hit[1]
        mats.append(m)
    return mats


def make_doom_duel(**kwargs: Any) -> DoomDuelEnv:
    """A 2-agent VizDoom duel (pass `num_agents`, `num_bots` and the rest to change it)."""
    return DoomDuelEnv(**kwargs)

