"""The rollout worker's side of surviving faults (a mixin of ``RolloutWorker``).

- **Its own restart.** At start it reclaims the slots its previous incarnation left taken that
  nobody downstream holds (:class:`components.datapath.slot_stages.WorkerSlots`), then takes fresh
  slots split by split as the pool allows (the batcher may still hold many).
- **A batcher's restart.** ``on_batcher_started`` (and a periodic look at the epochs in shared
  memory, for an announcement it missed) releases the slots the old batcher held.
- **An inference worker's restart.** Every request carries a sequence number. A split whose
  actions did not come within ``inference_timeout_s`` (checked every that many seconds, so after
  one to two timeouts) sends its request again under a new number; an answer to an older number
  is ignored. So a request lost with a dead inference worker costs a few seconds, never a hang.
- **Env faults.** Envs are wrapped in :class:`components.envs.guard.GuardedEnv` (non-finite
  outputs, hung steps raise ``EnvError``; the worker recreates the env).
- **Audit.** At a graceful stop it logs its slots by stage and whatever does not add up.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any

import numpy as np

from components.datapath.slot_stages import BatcherStarted, WorkerSlots
from components.envs import EnvError, MultiAgentEnv
from components.envs.guard import StepWatchdog, make_guarded_env
from sfbus import slot


def env_seed(seed: int, worker: int, env: int, incarnation: int = 0) -> int:
    """Seed of env ``env`` of worker ``worker``; a recreated env gets a fresh one."""
    words = [seed, worker, env] + ([incarnation] if incarnation else [])
    return int(np.random.SeedSequence(words).generate_state(1)[0])


class WorkerFaults:
    """Fault handling of a rollout worker; uses the worker's pool, splits and requests."""

    params: Any
    pool: Any
    paused: Any
    awaiting: list[int]
    row_slots: np.ndarray
    rows_per_split: int

    def _start_faults(self: Any) -> None:
        """Reclaim what a previous incarnation left; number requests; start the watchdog."""
        p = self.params
        self.stages = WorkerSlots(self.context, self.name, self.pool)
        self.restart_salt = self.pool.acquired_total  # 0 at a run's first start
        reclaimed = self.stages.reclaim()
        if reclaimed or self.pool.in_use:
            self.log.warning("%s: restarted; took back %d slots and leaves %d with the batcher "
                             "and learner", self.name, reclaimed, self.pool.in_use)
        # Request numbers start from the (system-wide monotonic) clock, so that a restarted
        # worker never takes an answer meant for its previous incarnation.
        self._seq = [time.monotonic_ns()] * p.num_splits
        self._seq_checked = list(self._seq)
        self.requests_resent = 0
        self.stale_answers = 0
        self._watchdog = (StepWatchdog(p.env_step_timeout_s) if p.env_step_timeout_s > 0
                          else None)
        self._env_failure_times: deque[float] = deque()
        self.every(p.inference_timeout_s, self._check_faults)

    def _stop_faults(self: Any) -> None:
        """Log the slot audit and stop the watchdog."""
        if hasattr(self, "stages"):
            rps = self.rows_per_split
            active = [self.row_slots[s * rps:(s + 1) * rps] for s in range(len(self.t))
                      if s not in self.paused]
            counts = self.stages.audit(np.concatenate(active) if active else np.zeros(0, int))
            self.log.info("%s: slot audit: %s", self.name,
                          " ".join(f"{k}={v}" for k, v in counts.items()))
        if getattr(self, "_watchdog", None) is not None:
            self._watchdog.close()
            self._watchdog = None

    def _recreate(self: Any, e: int, out: dict[str, np.ndarray], error: EnvError) -> None:
        """Replace broken env ``e`` with a fresh one reset into ``out``; its episode is lost.
        Creation that fails is retried with back-off; past the attempts, or past
        ``max_env_failures_per_minute``, the process gives up (the supervisor restarts it)."""
        p = self.params
        self.env_failures += 1
        self._m_failures.inc()
        now = time.monotonic()
        recent = self._env_failure_times
        recent.append(now)
        while recent and now - recent[0] > 60.0:
            recent.popleft()
        if len(recent) > p.max_env_failures_per_minute:
            self.fail_process(f"{len(recent)} env failures within a minute, the last: {error}")
        self._rl_log.warning("env-error", "%s: env %d failed (%s); recreating it and dropping "
                             "its unfinished episode", self.name, e, error)
        try:
            self.envs[e].close()
        except Exception:  # a broken env may also fail to close; the new one matters
            self.log.debug("closing broken env %d failed", e, exc_info=True)
        for attempt in range(p.env_recreate_attempts):
            self._incarnations[e] += 1
            env = None
            try:
                env = self._new_env()
                env.reset_into(out, seed=env_seed(p.seed, self.worker, e, self._incarnations[e]))
            except Exception as failure:  # VizDoom cannot start, /dev/shm full, a buggy reset
                if env is not None:
                    with contextlib.suppress(Exception):
                        env.close()
                if attempt + 1 == p.env_recreate_attempts:
                    self.fail_process(f"env {e} could not be recreated in {attempt + 1} "
                                      f"attempts: {failure!r}")
                self._rl_log.warning("env-recreate", "%s: recreating env %d failed (%r); "
                                     "trying again", self.name, e, failure)
                time.sleep(0.1 * 2 ** attempt)  # blocks the worker: its envs are what failed
                continue
            self.envs[e] = env
            self._apply_shaping(e)
            return

    def _new_env(self: Any) -> MultiAgentEnv:
        """A fresh env of the run, guarded against non-finite outputs and hung steps."""
        return make_guarded_env(self.params.env, self.params.env_kwargs, self._watchdog)

    def _next_seq(self: Any, s: int) -> int:
        """The number of split ``s``'s next inference request."""
        self._seq[s] += 1
        return self._seq[s]

    def _stale_answer(self: Any, s: int, seq: int) -> bool:
        """Whether an answer numbered ``seq`` is for a request of ``s`` sent again since."""
        if seq and seq != self._seq[s]:
            self.stale_answers += 1
            return True
        return False

    def _check_faults(self: Any) -> None:
        """Re-send requests unanswered since the last check; catch up with batcher restarts."""
        for s, seq in enumerate(self._seq):
            if self.awaiting[s] and seq == self._seq_checked[s]:
                self.requests_resent += 1
                self._rl_log.warning("resend", "%s: no actions for split %d within %g s; sending "
                                     "its request again (%d so far)", self.name, s,
                                     self.params.inference_timeout_s, self.requests_resent)
                self._request(s)
        self._seq_checked = list(self._seq)
        self._took_back(self.stages.poll())

    @slot
    def on_batcher_started(self: Any, msg: BatcherStarted) -> None:
        """A batcher (re)started: take back the slots an older one held."""
        self._took_back(self.stages.advance(msg.policy, msg.epoch))

    def _took_back(self: Any, released: int) -> None:
        if released:
            self.log.warning("%s: a batcher restarted; took back the %d slots the old one held",
                             self.name, released)
            self._resume_paused()
            self._m_free.set(self.pool.free)
