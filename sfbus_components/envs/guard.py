"""Environment faults a rollout worker survives: non-finite outputs and steps that hang.

:class:`GuardedEnv` wraps an env so that every fault surfaces as :class:`EnvError`, which the
worker already answers by recreating the env and dropping its unfinished episode:

- a reward or float observation that is NaN or infinite;
- a step that runs longer than ``env_step_timeout_s``. One :class:`StepWatchdog` thread per worker
  watches the step in progress (the main thread only bumps a counter per step; no clock reads on
  the hot path). At the deadline it aborts the env: ``env.abort()`` if the env has one, else it
  kills the engine processes the env started (VizDoom's; ``make_action`` releases the GIL and
  raises as soon as its engine dies). If the step still has not returned after a grace period,
  or the env has nothing to kill (a pure-Python env stuck in a loop or a sleep), it interrupts the
  main thread with SIGUSR2, whose handler raises :class:`EnvStepTimeout` only while that very step
  is still running. A step stuck in C code that holds the GIL cannot be interrupted from inside
  the process: the worker then stops heart-beating and the supervisor restarts it.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from typing import Any

import numpy as np

from sfbus_components.envs import EnvError, MultiAgentEnv, make_env
from sfbus_components.envs.spec import EnvWrapper, ObsDict, StepOutput

_INTERRUPT = signal.SIGUSR2


class EnvStepTimeout(EnvError):
    """An env step ran past its deadline and was interrupted."""


class StepWatchdog:
    """A daemon thread that aborts the env step in progress once it runs past ``timeout`` s."""

    def __init__(self, timeout: float, grace: float = 2.0) -> None:
        self.timeout = timeout
        self.grace = grace
        self.active: GuardedEnv | None = None
        self.step = 0
        self.aborts = 0
        self._target = -1  # the step the interrupt signal may break
        self._stop = threading.Event()
        self._main = threading.main_thread().ident
        self._signals = _install(self)
        self._thread = threading.Thread(target=self._watch, name="env-step-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and put back the previous signal handler."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        if self._signals:
            _uninstall(self)
            self._signals = False

    def _on_signal(self) -> None:
        if self.active is not None and self.step == self._target:
            self._target = -1
            raise EnvStepTimeout(f"env step hung for more than {self.timeout:g} s")

    def _watch(self) -> None:
        period = min(self.timeout / 4, 0.5)
        seen, since, aborted_at = -1, 0.0, 0.0
        while not self._stop.wait(period):
            env = self.active
            step = self.step
            now = time.monotonic()
            if env is None or step != seen:  # idle, or a new step began since the last look
                seen, since, aborted_at = (step if env is not None else -1), now, 0.0
                continue
            if not aborted_at and now - since >= self.timeout:
                aborted_at = now
                self.aborts += 1
                if not env.abort():
                    self._interrupt(step)
            elif aborted_at and now - aborted_at >= self.grace:
                self._interrupt(step)
                aborted_at = math.inf  # once per step

    def _interrupt(self, step: int) -> None:
        if self._signals and self._main is not None and self.step == step:
            self._target = step
            signal.pthread_kill(self._main, _INTERRUPT)


class GuardedEnv(EnvWrapper):
    """An env whose faults (non-finite outputs, hung steps) raise :class:`EnvError`."""

    def __init__(self, env: MultiAgentEnv, watchdog: StepWatchdog | None,
                 engines: set[int] | None = None) -> None:
        super().__init__(env)
        self.watchdog = watchdog
        self.engines = engines or set()
        self.timed_out = False
        self._float_keys = [k for k, f in env.spec.observation_space.items()
                            if np.dtype(f.dtype).kind == "f"]

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Reset the wrapped env; whatever it raises is an :class:`EnvError`."""
        try:
            self.env.reset_into(obs_out, seed=seed)
        except EnvError:
            raise
        except Exception as error:
            raise _as_env_error("reset", error) from error

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step under the watchdog; raise EnvError on a hang, a non-finite output or anything
        the env raised (a ValueError, a gymnasium assertion, a wrongly shaped observation)."""
        try:
            out = self._step(actions, obs_out)
        except EnvError:
            raise
        except Exception as error:
            raise _as_env_error("step", error) from error
        rewards = out[0]
        if not math.isfinite(rewards.item() if rewards.size == 1
                             else rewards.sum(dtype=np.float64)):
            raise EnvError(f"the env returned a non-finite reward {rewards.tolist()}")
        for key in self._float_keys:
            if not math.isfinite(obs_out[key].sum(dtype=np.float64)):
                raise EnvError(f"the env returned a non-finite observation {key!r}")
        return out

    def _step(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        watchdog = self.watchdog
        if watchdog is None:
            out = self.env.step_into(actions, obs_out)
        else:
            watchdog.step += 1
            watchdog.active = self
            try:
                out = self.env.step_into(actions, obs_out)
            except EnvError as error:
                if self.timed_out and not isinstance(error, EnvStepTimeout):
                    raise EnvStepTimeout(f"env step took more than {watchdog.timeout:g} s and "
                                         f"was aborted ({error})") from error
                raise
            finally:
                watchdog.active = None
            if self.timed_out:
                raise EnvStepTimeout(f"env step took more than {watchdog.timeout:g} s")
        return out

    def abort(self) -> bool:
        """Make a hung step return (watchdog thread): True if something was done to it."""
        self.timed_out = True
        abort = getattr(self.env, "abort", None)
        if callable(abort):
            abort()
            return True
        killed = False
        for pid in self.engines:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed = True
        return killed

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()


# One handler for every watchdog of the process (tests host several workers in one).
_WATCHDOGS: list[StepWatchdog] = []
_PREVIOUS: list[Any] = []


def _install(watchdog: StepWatchdog) -> bool:
    if threading.current_thread() is not threading.main_thread():
        return False  # signal handlers can only be installed from the main thread
    if not _WATCHDOGS:
        _PREVIOUS[:] = [signal.signal(_INTERRUPT, _on_interrupt)]
    _WATCHDOGS.append(watchdog)
    return True


def _uninstall(watchdog: StepWatchdog) -> None:
    _WATCHDOGS.remove(watchdog)
    if not _WATCHDOGS and _PREVIOUS:
        signal.signal(_INTERRUPT, _PREVIOUS.pop())


def _on_interrupt(signum: int, frame: Any) -> None:
    for watchdog in list(_WATCHDOGS):
        watchdog._on_signal()


def _as_env_error(what: str, error: Exception) -> EnvError:
    text = str(error).splitlines()[0] if str(error) else ""
    return EnvError(f"the env's {what} raised {type(error).__name__}" + (f": {text}" if text
                                                                         else ""))


class GuardedAgentsEnv(GuardedEnv):
    """A heterogeneous env's guard (``spec.agent_specs``): each agent's float observations are
    checked in its own dict (the class is chosen once, so other envs' steps test nothing more)."""

    def __init__(self, env: MultiAgentEnv, watchdog: StepWatchdog | None,
                 engines: set[int] | None = None) -> None:
        super().__init__(env, watchdog, engines)
        self._float_keys = []
        self._agent_float_keys = [(i, k) for i, spec in enumerate(env.spec.agent_specs)
                                  for k, f in spec.observation_space.items()
                                  if np.dtype(f.dtype).kind == "f"]

    def step_into(self, actions: Any, obs_out: Any) -> StepOutput:
        """Step as :meth:`GuardedEnv.step_into`, then check every agent's float observations."""
        out = super().step_into(actions, obs_out)
        for agent, key in self._agent_float_keys:
            if not math.isfinite(obs_out[agent][key].sum(dtype=np.float64)):
                raise EnvError(f"the env returned a non-finite observation {key!r} for agent "
                               f"{agent}")
        return out


def make_guarded_env(name: str, kwargs: dict[str, Any],
                     watchdog: StepWatchdog | None) -> GuardedEnv:
    """Create env ``name`` wrapped in a :class:`GuardedEnv`, noting the processes it started."""
    before = child_pids() if watchdog is not None else set()
    env = make_env(name, **kwargs)
    guard = GuardedAgentsEnv if env.spec.heterogeneous else GuardedEnv
    return guard(env, watchdog, None if watchdog is None else child_pids() - before)


def child_pids() -> set[int]:
    """Pids of this process's children (from /proc; empty where it cannot be read)."""
    me = os.getpid()
    found: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{task}/children") as file:
                found.update(int(pid) for pid in file.read().split())
        return found
    except OSError:
        pass
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as file:
                    # the command may contain spaces; the fields after its ')' are fixed
                    if int(file.read().rpartition(")")[2].split()[1]) == me:
                        found.add(int(entry))
    return found
