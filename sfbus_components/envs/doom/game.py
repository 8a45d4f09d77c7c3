"""VizDoom scenarios as single-agent `MultiAgentEnv`s: headless, 160x120 render, resized obs.

Observation `obs` is uint8 `(3, H, W)` channels-first (default 72x128), what torch convs take.
VizDoom renders RGB24 (HWC) at 160x120, its cheapest resolution; cv2 resizes it into a
preallocated HWC buffer and one transposing copy (~7 us) writes the CHW row the caller passed.
Measured per step on basic (frameskip 4, one core): engine ~125 us, INTER_AREA +80 us,
INTER_LINEAR +20 us, three single-plane resizes of a CRCGCB frame slower than one RGB resize.
Default is INTER_LINEAR: for these <2x downscales it keeps ~95% of the raw frame rate, where
INTER_AREA costs ~40% (Sample Factory itself uses INTER_NEAREST). At `resolution=None` the
frame is rendered CHW (CRCGCB) and copied without any transpose.
The `full` action space adds `measurements` float32 `(19,)`, the paper's; Sample Factory's
scenarios add theirs, `(23,)` (see `spaces.py`).

Deathmatch scenarios are hosted matches against ZDoom's built-in bots, scored by frags:
`deathmatch_bots` (7 bots on Sample Factory's dwango5 map) and `duel_bots` (1 bot on ssl2), as
Sample Factory trains them, and `deathmatch` on the CIG competition map (`cig.wad`, map01) with
`deathmatch.cfg`'s buttons and 4200-tic timeout: the shipped `deathmatch.wad` is a
single-player monster arena that crashes VizDoom 1.3 when hosted with `-deathmatch`; it stays
available as `deathmatch_monsters`. See `scenarios.py` for every scenario and where its files
come from.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import tempfile
from typing import Any

import cv2
import numpy as np
import vizdoom as vzd

from sfbus_components.envs.doom import spaces as ds
from sfbus_components.envs.doom.scenarios import SCENARIOS, Scenario, scenario_files
from sfbus_components.envs.doom.scenarios import scenario as scenario_entry
from sfbus_components.envs.doom.shm import start_sweeper
from sfbus_components.envs.spec import (
    EnvError,
    EnvSpec,
    EpisodeStats,
    MultiAgentEnv,
    ObsDict,
    ObsField,
    StepOutput,
)

_ENGINE_ERRORS = (vzd.ViZDoomUnexpectedExitException, vzd.ViZDoomIsNotRunningException,
                  vzd.ViZDoomErrorException, vzd.SharedMemoryException, vzd.MessageQueueException)
_NATIVE = (160, 120)  # RES_160X120, the cheapest resolution VizDoom renders
V = vzd.GameVariable
INTERPOLATION = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR,
                 "nearest": cv2.INTER_NEAREST}
# Hosted deathmatch as in ViZDoom's bot examples and Sample Factory: forced respawn, no autoaim,
# crouch, jump or mouse look, spawn far from others, no level exit before the time is up;
# +viz_nocheat 0 lets us send "addbot". The respawn delay is the scenario's.
_DEATHMATCH_ARGS = ("-host 1 -deathmatch +sv_forcerespawn 1 +sv_noautoaim 1 +sv_respawnprotect 1"
                    " +sv_spawnfarthest 1 +sv_nocrouch 1 +sv_nojump 1 +sv_nofreelook 1"
                    " +sv_noexit 1 +viz_nocheat 0 +name AI +colorset 0")


@functools.cache
def engine_config_path() -> str:
    """VizDoom's engine config file, outside the working directory (VizDoom otherwise writes
    _vizdoom.ini into every process's cwd), in a folder only this user can write: a fixed path
    in /tmp could be planted or symlinked by another user."""
    folder = os.path.join(tempfile.gettempdir(), f"sfbus-vizdoom-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        folder = tempfile.mkdtemp(prefix="sfbus-vizdoom-")  # someone else's: use a fresh one
    return os.path.join(folder, "vizdoom.ini")


def make_engine_home() -> None:
    """Create ``./_vizdoom``, the folder every VizDoom engine makes in its working directory as
    it starts: engines started at once in a fresh directory race to create it, and a loser dies
    (SIGSEGV after "Failed to create ./_vizdoom/ directory: File exists")."""
    with contextlib.suppress(OSError):  # not writable: the engine's own error says so
        os.makedirs("_vizdoom", exist_ok=True)


def _check_choices(frameskip: int, action_space: str, interpolation: str) -> None:
    if frameskip < 1:
        raise ValueError(f"frameskip must be >= 1, not {frameskip}")
    if action_space not in ("auto", "simple", "full"):
        raise ValueError(f"action_space must be 'auto', 'simple' or 'full', not "
                         f"{action_space!r}")
    if interpolation not in INTERPOLATION:
        raise ValueError(f"interpolation must be one of {sorted(INTERPOLATION)}")


class DoomEnvError(EnvError):
    """The VizDoom engine process exited or stopped answering; recreate the env."""


class DoomEnv(MultiAgentEnv):
    """One VizDoom game (one agent). Build with `make_doom_env`.

    Args: `action_space` "auto" (the scenario's Sample Factory heads, else `simple`) |
    "simple" | "full" (see `spaces.py`); `frameskip` tics per step; `resolution` (width, height)
    of `obs`, None for the native 160x120; `num_bots` for deathmatch scenarios (default: the
    scenario's); `reward_shaping` coefficients by key of `spaces.SHAPING_TERMS` (default: the
    scenario's, else off); `measurements` (default: on with the full space or where the
    scenario has its own); `interpolation` "linear" | "area" | "nearest"; `episode_timeout` in
    tics (default: the scenario's own); `scenarios_dir` a folder holding Sample Factory's
    scenario files (default: those of an installed `sample-factory` package).
    """

    def __init__(self, scenario: str, *, action_space: str = "auto", frameskip: int = 4,
                 resolution: tuple[int, int] | None = (128, 72), seed: int | None = None,
                 num_bots: int | None = None, reward_shaping: dict[str, float] | None = None,
                 measurements: bool | None = None, interpolation: str = "linear",
                 episode_timeout: int | None = None, scenarios_dir: str | None = None) -> None:
        sc = scenario_entry(scenario)
        _check_choices(frameskip, action_space, interpolation)
        self.scenario = scenario
        self.num_bots = sc.num_bots if num_bots is None else num_bots
        if self.num_bots and not sc.deathmatch:
            deathmatches = sorted(k for k, v in SCENARIOS.items() if v.deathmatch)
            raise ValueError(f"scenario {scenario!r} is single-player; bots need one of "
                             f"{deathmatches}")
        cfg, wad = scenario_files(scenario, sc, scenarios_dir)
        self._deathmatch = sc.deathmatch
        self._frameskip = frameskip
        full = action_space == "full"
        heads = ds.FULL_HEADS if full else sc.heads if action_space == "auto" else None
        self._gathering = sc.gathering
        if reward_shaping is None and sc.reward_shaping is not None:
            reward_shaping = dict(sc.reward_shaping)
        self._shaping_on = reward_shaping is not None
        self.reward_shaping: dict[str, float] = dict(reward_shaping or {})
        """Shaping coefficients, read every step: mutate in place (PBT does)."""
        ds.check_shaping_keys(self.reward_shaping)

        start_sweeper()
        self._game = g = vzd.DoomGame()
        g.set_doom_config_path(engine_config_path())
        g.load_config(cfg)
        if wad:
            g.set_doom_scenario_path(wad)
        if sc.doom_map:
            g.set_doom_map(sc.doom_map)
        g.set_window_visible(False)
        g.set_mode(vzd.Mode.PLAYER)
        self._set_screen(g, resolution)
        timeout = sc.episode_timeout if episode_timeout is None else episode_timeout
        if timeout is not None:
            g.set_episode_timeout(timeout)
        _apply_scenario_overrides(g, sc)
        if heads:
            g.set_available_buttons(ds.head_buttons(heads))
        self._set_variables(g, sc, (full or sc.measurements is not None)
                            if measurements is None else measurements)
        if sc.deathmatch:
            g.add_game_args(f"{_DEATHMATCH_ARGS} +viz_respawn_delay {sc.respawn_delay}")
        if seed is not None:
            g.set_seed(seed)
        make_engine_home()
        try:
            g.init()
        except _ENGINE_ERRORS as e:
            raise DoomEnvError(f"VizDoom failed to start scenario {scenario!r}: {e}") from e
        self._closed = False
        self._interp = INTERPOLATION[interpolation]
        self._spec = self._build_spec(g, heads, frameskip, sc.reward_scale)
        self._stats = EpisodeStats(1, frameskip)
        self._true_return = 0.0
        self._prev: dict[Any, float] | None = None  # shaping's last reading; None: none yet
        self._weapon = (-1.0, 0)  # the selected weapon and for how many steps in a row
        self._dead = False
        self._start_frags = 0.0
        self._health: float | None = None  # the gathering shaping's last health reading
        self._needs_reset = True

    def _set_screen(self, g: vzd.DoomGame, resolution: tuple[int, int] | None) -> None:
        g.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
        self._wh = _NATIVE if resolution is None else (int(resolution[0]), int(resolution[1]))
        if min(self._wh) <= 0:
            raise ValueError(f"resolution must be (width, height) > 0, not {resolution}")
        self._resize = self._wh != _NATIVE
        # Resizing wants HWC for cv2; without a resize, CHW straight from the engine is cheapest.
        g.set_screen_format(vzd.ScreenFormat.RGB24 if self._resize else vzd.ScreenFormat.CRCGCB)
        self._hwc = np.empty((self._wh[1], self._wh[0], 3), np.uint8)
        self._screen: np.ndarray | None = None  # the last native frame, for render()

    def _set_variables(self, g: vzd.DoomGame, sc: Any, use_meas: bool) -> None:
        """The game variables read each step: the measurements fed to the model (when on) and
        those the reward shaping and the gathering shaping read."""
        layout = sc.measurements or ds.MEASUREMENTS
        # A scenario's own layout is Sample Factory's, which reads only what the cfg reports.
        reported = set(g.get_available_game_variables()) if sc.measurements else None
        meas_vars = [m.variable for m in layout if reported is None or m.variable in reported] \
            if use_meas else []
        self._svars = ds.shaping_variables(self.reward_shaping)
        health = [vzd.GameVariable.HEALTH] if self._gathering else []
        all_vars = list(dict.fromkeys(meas_vars + self._svars + health))
        g.set_available_game_variables(all_vars)
        self._measure = ds.MeasurementReader(layout, all_vars, reported) if use_meas else None
        self._sidx = np.array([all_vars.index(v) for v in self._svars], np.int64)

    def _build_spec(self, g: vzd.DoomGame, heads: Any, frameskip: int,
                    reward_scale: float) -> EnvSpec:
        # Per head, per index: the button it presses (multi-head spaces), else the `simple` rows
        self._table = ds.action_table(heads) if heads else None
        if self._table is None:
            self._simple = ds.simple_actions(g.get_available_buttons())
        self._nbuttons = len(g.get_available_buttons())
        fields = {"obs": ObsField((3, self._wh[1], self._wh[0]), "uint8")}
        if self._measure is not None:
            fields["measurements"] = ObsField((self._measure.size,), "float32")
        heads_n = ds.head_sizes(heads) if heads else (len(self._simple),)
        return EnvSpec(fields, action_heads=heads_n, num_agents=1, frameskip=frameskip,
                       reward_scale=reward_scale)

    @property
    def spec(self) -> EnvSpec:
        """The env's fixed spec."""
        return self._spec

    @property
    def game(self) -> vzd.DoomGame:
        """The underlying `vizdoom.DoomGame` (for inspection; do not step it directly)."""
        return self._game

    def render(self) -> np.ndarray:
        """The frame of the current observation at the native 160x120: RGB uint8 `(120, 160, 3)`.

        What `sfbus enjoy --video` records; costs nothing per step (the engine hands us a fresh
        array per state, so keeping a reference to the last one is enough).
        """
        if self._screen is None:
            raise RuntimeError("call reset() before render()")
        if self._resize:  # RGB24, already HWC
            return self._screen
        return np.ascontiguousarray(self._screen.transpose(1, 2, 0))  # CRCGCB -> HWC

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Start a new episode and write its first observation into `obs_out` row 0."""
        try:
            if seed is not None:
                self._game.set_seed(seed)
            self._new_episode()
            self._write_obs(self._game.get_state(), obs_out)
        except _ENGINE_ERRORS as e:
            raise self._died(e) from e
        self._stats.clear()
        self._needs_reset = False

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Repeat `actions[0]` for `frameskip` tics; auto-reset at episode end."""
        if self._needs_reset:
            raise RuntimeError("call reset() before the first step()")
        g = self._game
        info: dict[str, Any] = {}
        terminated = truncated = False
        try:
            raw = g.make_action(self._buttons(actions[0]), self._frameskip)
            done = g.is_episode_finished()
            reward = raw
            if not done:  # an episode's last step is not shaped (no state to read), as in SF
                if self._deathmatch:  # the game respawns a dead player itself (forcerespawn)
                    was_dead, self._dead = self._dead, g.is_player_dead()
                    if was_dead and not self._dead:
                        self._prev = None  # a respawn's full health is no pickup: start anew
                if self._shaping_on:
                    reward += self._shape()
                if self._gathering:
                    reward += self._health_rose()
            self._stats.add(reward)
            self._true_return += raw
            if done:
                truncated = g.is_episode_timeout_reached()
                terminated = not truncated
                self._finish(info)
                self._new_episode()
            self._write_obs(g.get_state(), obs_out)
        except _ENGINE_ERRORS as e:
            raise self._died(e) from e
        return (np.array([reward], np.float32), np.array([terminated]),
                np.array([truncated]), [info])

    def close(self) -> None:
        """Stop the VizDoom process; safe to call twice."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._game.close()

    def _buttons(self, action: np.ndarray) -> list[float]:
        if self._table is None:
            return self._simple[int(action[0])]
        vec = [0.0] * self._nbuttons
        for head, a in zip(self._table, action.tolist(), strict=True):
            hit = head[a]
            if hit is not None:
                vec[hit[0]] = hit[1]
        return vec

    def _write_obs(self, state: vzd.GameState, obs_out: ObsDict) -> None:
        self._screen = state.screen_buffer
        if self._resize:  # screen_buffer is (120, 160, 3) RGB24
            cv2.resize(state.screen_buffer, self._wh, dst=self._hwc, interpolation=self._interp)
            np.copyto(obs_out["obs"][0], self._hwc.transpose(2, 0, 1))
        else:  # (3, 120, 160) CRCGCB
            np.copyto(obs_out["obs"][0], state.screen_buffer)
        if self._measure is not None:
            self._measure.write(state.game_variables, obs_out["measurements"][0])

    def _shape(self) -> float:
        """This step's shaping reward against the last reading (0 for the first reading of an
        episode or a life, which only sets the baseline, as Sample Factory's)."""
        state = self._game.get_state()
        cur = dict(zip(self._svars, state.game_variables[self._sidx].tolist(), strict=True))
        prev, self._prev = self._prev, cur
        coef = self.reward_shaping.get(ds.WEAPON_READY, 0.0)
        if ds.WEAPON_READY in self.reward_shaping:
            weapon = max(0.0, cur[V.SELECTED_WEAPON])
            same = self._weapon[1] + 1 if weapon == self._weapon[0] else 1
            self._weapon = (weapon, same)
        if prev is None:
            return 0.0
        reward = ds.shaping_reward(self.reward_shaping, prev, cur)
        if coef and self._weapon[1] >= ds.WEAPON_READY_STEPS and \
                cur[V.SELECTED_WEAPON_AMMO] > 0:
            reward += coef
        return reward

    def _health_rose(self) -> float:
        """1 when health rose since the last step of this episode (not on its first step, as
        Sample Factory's DoomGatheringRewardShaping), else 0."""
        health = self._game.get_game_variable(vzd.GameVariable.HEALTH)
        rose = self._health is not None and health > self._health
        self._health = health
        return 1.0 if rose else 0.0

    def _new_episode(self) -> None:
        g = self._game
        g.new_episode()
        self._health = None
        self._prev = None
        self._weapon = (-1.0, 0)
        self._dead = False
        if self._deathmatch:
            g.send_game_command("removebots")
            for _ in range(self.num_bots):
                g.send_game_command("addbot")
            self._start_frags = g.get_game_variable(V.FRAGCOUNT)
        self._true_return = 0.0

    def _finish(self, info: dict[str, Any]) -> None:
        self._stats.finish(0, info)
        info["episode_true_return"] = self._true_return
        if self._deathmatch:  # the game scores a deathmatch by frags, not by its reward
            frags = self._game.get_game_variable(V.FRAGCOUNT) - self._start_frags
            info["episode_true_return"] = info["episode_frags"] = frags

    def _died(self, e: Exception) -> DoomEnvError:
        with contextlib.suppress(Exception):  # engine already broken: report the first error
            self.close()  # frees the engine's shared memory and message queues
        return DoomEnvError(f"VizDoom engine of scenario {self.scenario!r} died "
                            f"({type(e).__name__}: {e}); recreate the env")

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown, engine already gone
            self.close()


def _apply_scenario_overrides(game: vzd.DoomGame, sc: Scenario) -> None:
    """What the scenario's table entry changes against its cfg (see `scenarios`)."""
    game.set_render_decals(False)
    game.set_render_particles(False)
    if sc.living_reward is not None:
        game.set_living_reward(sc.living_reward)
    if sc.death_penalty is not None:
        game.set_death_penalty(sc.death_penalty)
    if sc.buttons is not None:
        game.set_available_buttons(list(sc.buttons))
    if sc.hud is not None:
        game.set_render_hud(sc.hud)
    if sc.weapon is not None:
        game.set_render_weapon(sc.weapon)


def make_doom_env(scenario: str, *, action_space: str = "auto", frameskip: int = 4,
                  resolution: tuple[int, int] | None = (128, 72), seed: int | None = None,
                  num_bots: int | None = None, reward_shaping: dict[str, float] | None = None,
                  **kwargs: Any) -> DoomEnv:
    """Create a headless VizDoom env; `resolution` is (width, height), None for 160x120."""
    return DoomEnv(scenario, action_space=action_space, frameskip=frameskip,
                   resolution=resolution, seed=seed, num_bots=num_bots,
                   reward_shaping=reward_shaping, **kwargs)
