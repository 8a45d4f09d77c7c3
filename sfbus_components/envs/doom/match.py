"""One networked VizDoom match: k player processes, each owning one engine, stepped in lock-step.

Every player is a process of its own (``multiprocessing`` spawn: the caller may hold torch and
threads). Threads of one process (Sample Factory's way) hang as soon as one game is started or
reset while its peers are not, and were no faster when every call was concurrent: one match of
2 players, random actions, 6.9k env frames/s from two threads against 7.3k from two player
processes (2026-11-26, AMD EPYC, 2 cores). Player 0 hosts on a free UDP port of 127.0.0.1 and
blocks in ``init()`` until the others joined, so all start together.

Wire format, per pipe: the env sends float64 arrays ``[command, *args]`` (a step's args: tics,
last, buttons); a player answers one byte string: float64 ``[finished, timeout_reached, *game
variables]`` then the uint8 observation ``(3, H, W)`` (only after a step's last advance and while
the episode runs: a finished episode has no screen). Within a step only the two flags are
current (the variables are read only when the env uses them). No pickling on the per-step path.

Each player process leads its own process group (``setpgid``) so that killing its group takes its
engine with it, and a watchdog thread kills that group when the parent dies (a SIGKILLed rollout
worker would otherwise leave engines spinning at full CPU). A group, not a session: Linux's
autogroup scheduling gives every session a share of its own, and with each player and its engine
in a session of its own the hosts' engines busy-polled for their peers far longer (self-play
training, AVX2-only, alternated: 2,564 and 2,681 env frames/s in the rollout process's session,
the engines 0.44 cores, against 2,333 and 2,344 and 0.52 in sessions of their own).
``make_action`` releases the GIL, so the watchdog runs even while an engine blocks.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from sfbus_components.envs.doom.shm import SHM_DIR
from sfbus_components.envs.doom.time_slice import request_short_slice

RESET, STEP, CLOSE = 0.0, 1.0, 2.0
"""Commands a player understands (the first float of what the env sends)."""
_HEADER = 2  # finished, timeout_reached
# A game advanced by several tics while its peers wait for the env deadlocks (vizdoom 1.3.2: 3 or
# 4 tics at once always hang, and so do players that each loop over a step's tics on their own),
# so every tic is one synchronised advance of all players, as in Sample Factory. Two tics per
# sync do not hang but cost more than they save: the engines busy-poll their UDP socket while
# they wait for each other (one duel, random actions: 5.7k env frames/s against 6.5k).
# Hosted deathmatch flags as in doom.py's bot deathmatch (instant forced respawn, no autoaim or
# crouch, spawn far apart; +viz_nocheat 0 lets the host send "addbot"), for k networked players.
# -netmode 0: peers send their tic commands to each other directly. Without it the joiner's
# commands go through the host, and the engine that waits busy-polls its socket for longer: one
# duel of random actions, 4 runs each, 6.6k-7.7k env frames/s against 4.8k-7.1k, the joiner's
# engine at 58-71 us of CPU per frame against 68-113.
_MATCH_ARGS = ("-netmode 0 -deathmatch +sv_forcerespawn 1 +sv_noautoaim 1 +sv_respawnprotect 1"
               " +sv_spawnfarthest 1 +sv_nocrouch 1 +viz_respawn_delay 0 +viz_nocheat 0")


class MatchError(RuntimeError):
    """A player process or its engine died, hung or failed to connect: tear the match down."""


@dataclass(frozen=True)
class PlayerSetup:
    """Everything a player process needs to build its game (plain values: it is pickled once)."""

    index: int
    num_players: int
    port: int
    cfg: str
    wad: str
    doom_map: str
    buttons: tuple[str, ...]
    """``vizdoom.Button`` names; the env maps actions onto them."""
    variables: tuple[str, ...]
    """``vizdoom.GameVariable`` names reported after every step."""
    frameskip: int
    resolution: tuple[int, int]
    interpolation: int
    """A cv2 interpolation flag."""
    episode_timeout: int
    num_bots: int
    connect_timeout_s: int
    seed: int | None
    ini_path: str


def free_udp_port() -> int:
    """A UDP port of 127.0.0.1 free right now (the kernel picks it; a clash is retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Match:
    """The player processes of one match, started together; ``close`` kills them and engines."""

    def __init__(self, setups: list[PlayerSetup], obs_shape: tuple[int, ...],
                 start_timeout_s: float, step_timeout_s: float) -> None:
        self.step_timeout_s = step_timeout_s
        self.num_vars = len(setups[0].variables)
        header = (_HEADER + self.num_vars) * 8
        self._obs_shape = obs_shape
        self._reply = [bytearray(header + int(np.prod(obs_shape))) for _ in setups]
        self._header = header
        self.engine_pids: list[int] = []
        """The VizDoom engine of each player (index 0: the host)."""
        self._instance_ids: list[str] = []
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        try:
            for setup in setups:
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_play, args=(theirs, setup), daemon=True,
                                   name=f"doom-player-{setup.index}")
                proc.start()
                theirs.close()
                self._conns.append(ours)
                self._procs.append(proc)
            self._players_by_fd = {conn.fileno(): i for i, conn in enumerate(self._conns)}
            self._poll = select.poll()
            for fd in self._players_by_fd:
                self._poll.register(fd, select.POLLIN)
            pids: dict[int, int] = {}
            for i in self._answers(start_timeout_s, "start"):
                pids[i] = int(np.frombuffer(self._recv(i), np.float64)[0])
                self._instance_ids.append(_instance_id(pids[i]))
            self.engine_pids = [pids[i] for i in range(len(setups))]
        except BaseException:
            self.close()
            raise

    def step(self, buttons: list[np.ndarray], frameskip: int
             ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Advance every game ``frameskip`` tics with these buttons held; the replies of
        ``receive`` (observations only at the end; earlier if an episode finished)."""
        # One tic per sync (see above); every sync but the last sends the same bytes.
        within, last = ([np.concatenate(([STEP, 1, final], b)).tobytes() for b in buttons]
                        for final in (False, True))
        for tic in range(1, frameskip + 1):
            self._send_bytes(last if tic == frameskip else within)
            replies = self.receive()
            if tic == frameskip or any(header[0] for header, _ in replies):
                return replies
        raise ValueError(f"frameskip must be >= 1, not {frameskip}")

    def send(self, command: float, args: list[np.ndarray] | None = None) -> None:
        """Send ``command`` to every player (``args[i]``: player i's arguments)."""
        self._send_bytes([np.concatenate(([command], [] if args is None else args[i])).tobytes()
                          for i in range(len(self._conns))])

    def _send_bytes(self, messages: list[bytes]) -> None:
        """``messages[i]`` to player i, the host first (the joiner first: self-play training
        at ~1.65k env frames/s instead of ~2.3k, its engine then waiting on the host's)."""
        try:
            for conn, message in zip(self._conns, messages, strict=True):
                conn.send_bytes(message)
        except OSError as e:
            raise MatchError(f"a player process is gone ({e})") from e

    def receive(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Every player's (header float64 [finished, timeout, *vars], obs uint8 or None)."""
        out: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        for i in self._answers(self.step_timeout_s, "step"):
            n = self._recv(i, self._reply[i])
            header = np.frombuffer(self._reply[i], np.float64, _HEADER + self.num_vars)
            obs = None
            if n > self._header:
                obs = np.frombuffer(self._reply[i], np.uint8, offset=self._header)
                obs = obs.reshape(self._obs_shape)
            out[i] = (header, obs)
        return [out[i] for i in range(len(self._conns))]

    def _recv(self, i: int, into: bytearray | None = None) -> Any:
        """Player i's next message (``into``: written there, its length returned)."""
        try:
            return self._conns[i].recv_bytes() if into is None else \
                self._conns[i].recv_bytes_into(into)
        except (EOFError, OSError) as e:
            raise MatchError(f"player {i} died ({type(e).__name__})") from e

    def _answers(self, timeout: float, what: str) -> Iterator[int]:
        """Each player's index as soon as it has something to read, which the caller must read
        before the next; raises on death or timeout."""
        pending = set(self._players_by_fd)
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                players = sorted(self._players_by_fd[fd] for fd in pending)
                raise MatchError(f"players {players} did not answer the {what} within "
                                 f"{timeout:g} s")
            # one poll object for the match's life: multiprocessing's wait() builds a selector
            # per call, four times per env step
            answered = [fd for fd, _ in self._poll.poll(min(left, 1.0) * 1000) if fd in pending]
            for fd in answered:  # each read by the caller before the next poll
                pending.discard(fd)
                yield self._players_by_fd[fd]
            # Nothing new within a second, or only a pipe already read hung up (its player
            # answered, then died): one dead player blocks the others for good.
            if not answered:
                for i, proc in enumerate(self._procs):
                    if not proc.is_alive():
                        raise MatchError(f"player {i} exited with code {proc.exitcode} "
                                         f"during the {what}")

    def abort(self) -> None:
        """Kill every player and engine now (any thread): a blocked step then fails at once."""
        for proc in self._procs:
            if proc.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the player's group: it and its engine
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGKILL)  # not yet in its own group
        for pid in self.engine_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def close(self, graceful: bool = False) -> None:
        """Stop the match (``graceful``: ask the players to close their games first)."""
        if graceful:
            with contextlib.suppress(MatchError):
                self.send(CLOSE)
            for proc in self._procs:
                proc.join(timeout=2.0)
        self.abort()
        for proc in self._procs:
            proc.join(timeout=5.0)
        for conn in self._conns:
            conn.close()
        for instance in self._instance_ids:  # a killed engine leaves its files behind
            for kind in ("SM", "MQCtr", "MQDoom"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, f"ViZDoom{kind}{instance}"))
        self._procs, self._conns, self._instance_ids = [], [], []



def _instance_id(engine_pid: int) -> str:
    """The engine's ``+viz_instance_id`` (names its /dev/shm files); empty if unreadable."""
    try:
        with open(f"/proc/{engine_pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        return argv[argv.index(b"+viz_instance_id") + 1].decode()
    except (OSError, ValueError, IndexError):
        return ""


def _engine_pid() -> int:
    """This player's engine: its child process that has a ViZDoom instance id."""
    me = os.getpid()
    for task in os.listdir(f"/proc/{me}/task"):
        with open(f"/proc/{me}/task/{task}/children") as f:
            for pid in map(int, f.read().split()):
                if _instance_id(pid):
                    return pid
    raise MatchError("the VizDoom engine process was not found")


@contextlib.contextmanager
def _quiet_fds() -> Iterator[None]:
    """Point stdout and stderr at /dev/null inside the block (processes started there keep it)."""
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def _watch_parent(parent: int) -> None:
    """Kill this player's group (it and its engine) once the parent process is gone."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)


def _build_game(s: PlayerSetup) -> Any:
    import vizdoom as vzd

    g = vzd.DoomGame()
    g.set_doom_config_path(s.ini_path)
    g.load_config(os.path.join(vzd.scenarios_path, s.cfg))
    g.set_doom_scenario_path(os.path.join(vzd.scenarios_path, s.wad))
    g.set_doom_map(s.doom_map)
    g.set_window_visible(False)
    g.set_mode(vzd.Mode.PLAYER)
    g.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
    g.set_screen_format(vzd.ScreenFormat.RGB24)
    g.set_episode_timeout(s.episode_timeout)
    g.set_available_buttons([getattr(vzd.Button, b) for b in s.buttons])
    g.set_available_game_variables([getattr(vzd.GameVariable, v) for v in s.variables])
    if s.index == 0:
        g.add_game_args(f"-host {s.num_players} -port {s.port} {_MATCH_ARGS}")
    else:
        g.add_game_args(f"-join 127.0.0.1 -port {s.port}")
    g.add_game_args(f"+viz_connect_timeout {s.connect_timeout_s} +name P{s.index} "
                    f"+colorset {s.index}")
    if s.seed is not None:
        g.set_seed(s.seed)
    return g


def _play(conn: Connection, s: PlayerSetup) -> None:
    """A player process: build and join the game, then answer commands until told to close."""
    import cv2

    os.setpgid(0, 0)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    game = _build_game(s)
    with _quiet_fds():  # the engine inherits them: its per-tic network chatter goes nowhere
        game.init()
    engine = _engine_pid()
    request_short_slice(engine)  # it busy-polls for its peers: see time_slice
    conn.send_bytes(np.array([engine], np.float64).tobytes())
    w, h = s.resolution
    hwc = np.empty((h, w, 3), np.uint8)
    header = np.zeros(_HEADER + len(s.variables))
    variables = game.get_available_game_variables()

    def new_episode() -> None:
        game.new_episode()
        if s.index == 0 and s.num_bots:
            game.send_game_command("removebots")
            for _ in range(s.num_bots):
                game.send_game_command("addbot")

    def reply(screen: bool = True) -> None:
        finished = game.is_episode_finished()
        header[0] = finished
        header[1] = game.is_episode_timeout_reached()
        if not (finished or screen):  # a sync inside a step: the env reads only the flags
            conn.send_bytes(header.tobytes())
            return
        state = None if finished else game.get_state()
        if state is None:  # no screen at an episode's end; the variables still read
            header[_HEADER:] = [game.get_game_variable(v) for v in variables]
            conn.send_bytes(header.tobytes())
            return
        header[_HEADER:] = state.game_variables
        cv2.resize(state.screen_buffer, (w, h), dst=hwc, interpolation=s.interpolation)
        conn.send_bytes(header.tobytes() + hwc.transpose(2, 0, 1).tobytes())

    while True:
        try:
            cmd = np.frombuffer(conn.recv_bytes(), np.float64)
        except EOFError:
            break
        if cmd[0] == CLOSE:
            break
        if cmd[0] == RESET:
            new_episode()
        else:
            tics, last = int(cmd[1]), bool(cmd[2])
            game.set_action(cmd[3:].tolist())
            game.advance_action(tics, last)
            # No respawn_player(): it runs tics in this game alone and the match hangs;
            # +sv_forcerespawn brings the dead back in lock-step.
            reply(screen=last)
            continue
        reply()
    game.close()
