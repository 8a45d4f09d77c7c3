"""A rollout worker's envs: created guarded and seeded, recreated after a fault, shaped by PBT.

Every env is wrapped in :class:`sfbus_components.envs.guard.GuardedEnv` (non-finite outputs and
steps longer than ``env_step_timeout_s`` raise ``EnvError``, a watchdog thread aborts a hung step).
An env that raised is closed and replaced by a fresh one under a new seed, reset into the rows its
step was writing; its unfinished episode is dropped. Creation that fails is retried with back-off;
past ``env_recreate_attempts``, or past ``max_env_failures_per_minute``, the worker gives up
(``fail``: its process ends and the supervisor restarts it). Under batched sampling an env family
with a native batch (EnvPool) gets one batch per split instead; its envs share one engine, so a
batch that raises ends the worker's process likewise (the watchdog does not watch it).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import NoReturn

import numpy as np

from sfbus import RateLimitedLog
from sfbus_components.envs import EnvError, MultiAgentEnv
from sfbus_components.envs.action_bounds import bound_actions
from sfbus_components.envs.guard import StepWatchdog, make_guarded_env
from sfbus_components.envs.registry import make_batched_env
from sfbus_components.envs.spec import ObsDict
from sfbus_components.envs.vector import BatchedEnv
from sfbus_components.sampling.rollout_params import RolloutParams


def env_seed(seed: int, worker: int, env: int, incarnation: int = 0) -> int:
    """Seed of env ``env`` of worker ``worker``; a recreated env gets a fresh one."""
    words = [seed, worker, env] + ([incarnation] if incarnation else [])
    return int(np.random.SeedSequence(words).generate_state(1)[0])


class WorkerEnvs:
    """The ``num_envs`` envs of rollout worker ``worker`` and what keeps them running."""

    def __init__(self, params: RolloutParams, name: str, worker: int, salt: int,
                 num_agents: int, agent_policy: np.ndarray, log: logging.Logger,
                 fail: Callable[[str], NoReturn]) -> None:
        self.params = params
        self.name = name
        self.worker = worker
        self.num_agents = num_agents
        self.agent_policy = agent_policy
        """Policy of every agent row: an env follows its agent 0's reward shaping."""
        self.log = log
        self._rl_log = RateLimitedLog(log)
        self.fail = fail
        """Ends the worker's process; called when envs cannot be recreated or keep failing."""
        self.failures = 0
        """Envs recreated after an EnvError."""
        self.shaping: dict[int, dict[str, float]] = {}
        """PBT's reward-shaping coefficients per policy."""
        self.watchdog = (StepWatchdog(params.env_step_timeout_s)
                         if params.env_step_timeout_s > 0 else None)
        # A restarted worker (salt > 0) seeds its envs afresh rather than replaying its first
        # episodes; every recreation of an env moves its seed on again.
        self._incarnations = [salt] * params.num_envs
        self._failure_times: deque[float] = deque()
        self.envs: list[MultiAgentEnv] = []
        """The envs; a recreated env replaces its entry (vectors over this list see it)."""
        self.batches: list[BatchedEnv] = []
        """Native batches (batched sampling of an env that has them), one per split."""

    def create(self, outs: list[ObsDict]) -> None:
        """Create every env and reset env ``e`` into ``outs[e]`` (then, with
        ``decorrelate_envs_on_one_worker``, step it ``rollout * e`` times at random)."""
        rng = np.random.default_rng([self.params.seed, self.worker, 0xDEC])
        for e, out in enumerate(outs):
            env = self._new()
            self.envs.append(env)
            env.reset_into(out, seed=self._seed(e))
            if self.params.decorrelate_envs_on_one_worker:
                spec = env.spec
                for _ in range(self.params.rollout * e):
                    actions = (spec.random_agent_actions(rng) if spec.heterogeneous
                               else spec.random_actions(rng, spec.num_agents)[0])
                    env.step_into(actions, out)  # episodes end and restart inside step_into

    def create_batch(self, first: int, count: int, obs: ObsDict) -> BatchedEnv | None:
        """Envs ``first..first + count`` as one native batch (EnvPool's) reset into the
        contiguous ``obs``, or None where the env has none (they are made one by one)."""
        p = self.params
        # The worker's seeds win over an `env_kwargs.seed`, as reset_into's do for one env.
        batch = make_batched_env(p.env, count, **{**p.env_kwargs, "seed": self._seed(first)})
        if batch is None:
            return None
        self.batches.append(batch)
        batch.reset_into(obs)
        return batch

    def batch_failed(self, error: EnvError) -> NoReturn:
        """A native batch broke: its envs share one engine, so the worker's process ends and
        the supervisor restarts it (no per-env recreation)."""
        self.fail(f"a batch of envs failed: {error}")

    def recreate(self, e: int, out: ObsDict, error: EnvError) -> None:
        """Replace broken env ``e`` with a fresh one reset into ``out``; its episode is lost."""
        p = self.params
        self.failures += 1
        now = time.monotonic()
        recent = self._failure_times
        recent.append(now)
        while recent and now - recent[0] > 60.0:
            recent.popleft()
        if len(recent) > p.max_env_failures_per_minute:
            self.fail(f"{len(recent)} env failures within a minute, the last: {error}")
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
                env = self._new()
                env.reset_into(out, seed=self._seed(e))
            except Exception as failure:  # VizDoom cannot start, /dev/shm full, a buggy reset
                if env is not None:
                    with contextlib.suppress(Exception):
                        env.close()
                if attempt + 1 == p.env_recreate_attempts:
                    self.fail(f"env {e} could not be recreated in {attempt + 1} attempts: "
                              f"{failure!r}")
                self._rl_log.warning("env-recreate", "%s: recreating env %d failed (%r); "
                                     "trying again", self.name, e, failure)
                time.sleep(0.1 * 2 ** attempt)  # blocks the worker: its envs are what failed
                continue
            self.envs[e] = env
            self.apply_shaping(e)
            return

    def set_shaping(self, policy: int, shaping: dict[str, float]) -> None:
        """Take ``policy``'s reward-shaping coefficients; apply them to the envs it acts in."""
        self.shaping[policy] = shaping
        for e in range(len(self.envs)):
            if self.agent_policy[e * self.num_agents] == policy:
                self.apply_shaping(e)

    def apply_shaping(self, e: int) -> None:
        """Set env ``e``'s shaping to its policy's (envs read ``reward_shaping`` every step).

        An env shapes one reward for all its agents: a multi-agent env follows agent 0's policy.
        """
        shaping = self.shaping.get(int(self.agent_policy[e * self.num_agents]))
        coefficients = getattr(self.envs[e], "reward_shaping", None)
        if shaping and isinstance(coefficients, dict):
            coefficients.update(shaping)

    def close(self) -> None:
        """Close every env and stop the watchdog."""
        for env in [*self.envs, *self.batches]:
            try:
                env.close()
            except Exception:  # an env that broke while closing must not keep the rest open
                self.log.exception("closing an env failed")
        if self.watchdog is not None:
            self.watchdog.close()
            self.watchdog = None

    def _new(self) -> MultiAgentEnv:
        p = self.params
        return bound_actions(make_guarded_env(p.env, p.env_kwargs, self.watchdog),
                             p.model.action_bounds)

    def _seed(self, e: int) -> int:
        return env_seed(self.params.seed, self.worker, e, self._incarnations[e])
