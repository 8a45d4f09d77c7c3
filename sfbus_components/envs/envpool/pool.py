"""EnvPool's tasks (`envpool:<task id>`, e.g. `envpool:Pong-v5`): many envs stepped by one call.

EnvPool (C++ envs behind one pybind11 call) steps a whole batch at once. Batched sampling makes
one :class:`EnvPoolBatch` per split, whose rows it steps with one call writing straight into the
split's block of the trajectory buffer (:class:`sfbus_components.envs.vector.BatchedEnv`); elsewhere
(non-batched sampling, evaluation, `sfbus enjoy`) :class:`EnvPoolEnv` is a one-env
`MultiAgentEnv` over the same code.

Auto-reset. EnvPool's gymnasium API resets an env on the step *after* the one that ended its
episode (gymnasium's next-step autoreset): that step ignores the action and returns the first
observation of the next episode with reward 0. sfbus's envs reset within the ending step
(:mod:`sfbus_components.envs.spec`), so after a step in which some envs ended, the batch steps just
those envs once more (EnvPool's `env_id` argument) and writes the observations that come back over
theirs: the rows then hold the next episode's first observation, the reward and done of the
ending step stay as they were. An explicit `reset(env_id)` would not do: under episodic life it
starts a new game where the autoreset only starts the next life.

Atari tasks (those with EnvPool's `episodic_life` setting) are configured like sfbus's own
`atari_<game>` envs (:mod:`sfbus_components.envs.atari.game`, Sample Factory's and CleanRL's chain):
no-op starts, frame skip 4 with max-pool, greyscale 84x84, 4 frames stacked, episodic life, FIRE on
reset, rewards clipped, no sticky actions, 27000 steps (108000 frames) a game; any of EnvPool's
settings can be changed through `env_kwargs` under its EnvPool name (`stack_num`, `frame_skip`,
`reward_clip`, ...). The reported episode is then the whole game over all its lives, with the raw
score as `episode_true_return`, as for `atari_<game>`.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import numpy as np

from sfbus_components.envs.family import unknown_env
from sfbus_components.envs.gym.adapter import _action_space, _obs_field
from sfbus_components.envs.spec import EnvError, EnvSpec, MultiAgentEnv, ObsDict, StepOutput
from sfbus_components.envs.vector import BatchedEnv, Ended

# sfbus's atari_<game> defaults, under EnvPool's names (EnvPool's own: no episodic life, no
# clipping); the rest (noop_max 30, frame_skip 4, stack_num 4, 84x84, INTER_AREA, FIRE on reset,
# no sticky actions, 27000 steps a game) are EnvPool's defaults already.
_ATARI = {"episodic_life": True, "reward_clip": True}
# Settings sfbus decides: the batch size is the split's envs, seeds come from the worker.
_OWNED = ("num_envs", "batch_size", "seed", "env_seed", "env_type", "max_num_players",
          "gym_reset_return_info")
# Settings EnvPool takes without complaint although they make no sense (checked here).
_AT_LEAST_ONE = ("stack_num", "frame_skip", "img_height", "img_width", "max_episode_steps",
                 "num_threads")
_PROBABILITIES = ("repeat_action_probability",)
_SEED_RANGE = 2**31 - 2**20  # EnvPool's seed is a C int and env i is seeded with seed + i


@functools.cache
def envpool_tasks() -> frozenset[str]:
    """Every task id EnvPool registers (cached)."""
    import envpool

    return frozenset(envpool.list_all_envs())


def resolve(name: str) -> EnvPoolFactory:
    """The factory of `envpool:<task>` (the registry's `envpool:` family)."""
    task = name[len("envpool:"):]
    if task not in envpool_tasks():
        raise unknown_env(name, [f"envpool:{t}" for t in sorted(envpool_tasks())])
    return EnvPoolFactory(task)


class EnvPoolFactory:
    """The factory of `envpool:<task>`: one-env `EnvPoolEnv`s, and `batched` for a split."""

    def __init__(self, task: str) -> None:
        self.task = task

    def __call__(self, seed: int | None = None, **kwargs: Any) -> EnvPoolEnv:
        """One env of the task; kwargs are EnvPool's settings."""
        return EnvPoolEnv(self.task, seed, kwargs)

    def batched(self, count: int, seed: int | None = None, **kwargs: Any) -> EnvPoolBatch:
        """``count`` envs of the task stepped by one call; kwargs are EnvPool's settings."""
        return EnvPoolBatch(self.task, count, seed, kwargs)


def envpool_config(task: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """EnvPool's settings for ``task``: sfbus's Atari defaults under ``kwargs``, checked."""
    import envpool

    owned = sorted(set(kwargs) & set(_OWNED))
    if owned:
        raise ValueError(f"envpool:{task}: {', '.join(owned)} cannot be set (sfbus sets them)")
    defaults = envpool.make_spec(task).config._asdict()
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        known = ", ".join(k for k in defaults if k not in _OWNED and k != "base_path")
        raise ValueError(f"envpool:{task}: unknown setting(s) {', '.join(unknown)}; EnvPool's "
                         f"settings for this task: {known}")
    config = {k: v for k, v in _ATARI.items() if k in defaults} | kwargs
    for key in _AT_LEAST_ONE:
        if key in kwargs and not (isinstance(kwargs[key], int) and kwargs[key] >= 1):
            raise ValueError(f"envpool:{task}: {key} must be an integer >= 1, not "
                             f"{kwargs[key]!r}")
    for key in _PROBABILITIES:
        if key in kwargs and not 0.0 <= kwargs[key] <= 1.0:
            raise ValueError(f"envpool:{task}: {key} must be in [0, 1], not {kwargs[key]!r}")
    if kwargs.get("noop_max", 0) < 0:
        raise ValueError(f"envpool:{task}: noop_max must be >= 0, not {kwargs['noop_max']!r}")
    if "num_threads" not in kwargs:
        config["num_threads"] = 1  # one core per rollout worker, as cv2 is set up there
    return config


class EnvPoolBatch(BatchedEnv):
    """``count`` envs of an EnvPool task (one agent each) in one pool, stepped by one call."""

    def __init__(self, task: str, count: int, seed: int | None, kwargs: dict[str, Any]) -> None:
        import envpool

        config = envpool_config(task, kwargs)
        seed = 0 if seed is None else seed % _SEED_RANGE
        try:
            with warnings.catch_warnings():
                # EnvPool builds float32 Boxes from float64 bounds: gymnasium warns, harmlessly.
                warnings.filterwarnings("ignore", message=".*precision lowered")
                self.pool = envpool.make(task, env_type="gymnasium", num_envs=count, seed=seed,
                                         **config)
                space, action_space = self.pool.observation_space, self.pool.action_space
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"envpool:{task}: EnvPool refused the settings {kwargs}: "
                             f"{error}") from error
        self.task = task
        self.seed = seed
        self.count = count
        self.num_agents = 1
        self.config = self.pool.spec.config._asdict()
        if self.config.get("max_num_players", 1) > 1:
            raise ValueError(f"envpool:{task} is a multi-player task; only one-agent EnvPool "
                             "tasks are supported")
        if type(space).__name__ != "Box":
            raise ValueError(f"envpool:{task}: its {type(space).__name__} observation space is "
                             "not supported; only Box observations are")
        field, _ = _obs_field(space)
        heads, box = _action_space(action_space)
        # Pixel tasks' frame_skip counts emulator frames (counted as env frames, as for
        # atari_<game>); MuJoCo's counts physics substeps of one step (counted as 1, as gym's).
        frameskip = int(self.config.get("frame_skip", 1)) if "img_height" in self.config else 1
        self.spec = EnvSpec({"obs": field}, action_heads=heads, action_box=box,
                            frameskip=frameskip)
        self._float_obs = field.dtype == "float32"
        self._discrete = bool(heads)
        self._action_dtype = action_space.dtype
        # Atari under episodic life: a training episode is a life, the reported one the game.
        self._lives = bool(self.config.get("episodic_life"))
        self._raw = "reward_clip" in self.config  # Atari: info["reward"] is the unclipped score
        self._returns = np.zeros(count, np.float64)
        self._true_returns = np.zeros(count, np.float64)
        self._lengths = np.zeros(count, np.int64)
        self.terminated = np.zeros(count, bool)
        """The last step's `terminated` per env (its `truncated` is the rest of its done)."""
        self.truncated = np.zeros(count, bool)
        """The last step's `truncated` per env."""

    def reset_into(self, obs: ObsDict) -> None:
        """Start every env's episode; write the first observations into rows ``[count, ...]``."""
        first, info = self.pool.reset()
        np.copyto(obs["obs"], first, casting="unsafe")
        # Atari's infos carry the raw reward and the game's own end; other tasks' do not.
        self._raw = self._raw and "reward" in info
        self._lives = self._lives and "terminated" in info
        self._returns[:] = self._true_returns[:] = 0.0
        self._lengths[:] = 0

    def step_rows(self, actions: np.ndarray, obs: ObsDict, rewards: np.ndarray,
                  dones: np.ndarray, time_outs: np.ndarray) -> Ended:
        """Step every env with one EnvPool call; reset the ended ones (see the module doc)."""
        acts = actions[:, 0] if self._discrete else actions.astype(self._action_dtype)
        try:
            next_obs, reward, terminated, truncated, info = self.pool.step(acts)
        except Exception as error:  # an action EnvPool refused, an engine that broke
            raise EnvError(f"envpool:{self.task}: the step raised {error!r}") from error
        if not math.isfinite(reward.sum(dtype=np.float64)):
            raise EnvError(f"envpool:{self.task} returned a non-finite reward")
        out = obs["obs"]
        np.copyto(out, next_obs, casting="unsafe")
        rewards[:] = reward
        np.logical_or(terminated, truncated, out=dones)
        np.greater(truncated, terminated, out=time_outs)  # truncated and not terminated
        self.terminated[:], self.truncated[:] = terminated, truncated
        self._returns += reward
        self._lengths += 1
        if self._raw:
            self._true_returns += info["reward"]
        ended = self._reset_ended(acts, dones, truncated, info, out) if dones.any() else []
        if self._float_obs and not math.isfinite(out.sum(dtype=np.float64)):
            raise EnvError(f"envpool:{self.task} returned a non-finite observation")
        return ended

    def _reset_ended(self, acts: np.ndarray, dones: np.ndarray, truncated: np.ndarray,
                     info: dict[str, Any], out: np.ndarray) -> Ended:
        """Report the games that ended, then reset the ended envs into their rows of ``out``."""
        ended_ids = np.flatnonzero(dones)
        game_over = dones if not self._lives else truncated | info["terminated"].astype(bool)
        ended: Ended = []
        for i in ended_ids.tolist():
            report: dict[str, Any] = {}
            if game_over[i]:
                report["episode_return"] = float(self._returns[i])
                report["episode_length"] = int(self._lengths[i])
                report["episode_frames"] = int(self._lengths[i]) * self.spec.frameskip
                if self._raw:
                    report["episode_true_return"] = float(self._true_returns[i])
                self._returns[i] = self._true_returns[i] = 0.0
                self._lengths[i] = 0
            ended.append((i, [report]))
        # EnvPool's next-step autoreset, asked for at once for just these envs (action ignored).
        try:
            first, _, _, _, again = self.pool.step(acts[ended_ids], ended_ids)
        except Exception as error:
            raise EnvError(f"envpool:{self.task}: the reset step raised {error!r}") from error
        out[again["env_id"]] = first
        return ended

    def close(self) -> None:
        """Close the pool; safe to call twice."""
        self.pool.close()


class EnvPoolEnv(MultiAgentEnv):
    """One env of an EnvPool task as a one-agent `MultiAgentEnv` (a batch of one)."""

    def __init__(self, task: str, seed: int | None, kwargs: dict[str, Any]) -> None:
        self.task = task
        self.kwargs = kwargs
        self.batch = EnvPoolBatch(task, 1, seed, kwargs)
        self._rewards = np.zeros(1, np.float32)
        self._dones = np.zeros(1, bool)
        self._time_outs = np.zeros(1, bool)

    @property
    def spec(self) -> EnvSpec:
        """The env's fixed spec."""
        return self.batch.spec

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Start a new episode into `obs_out` row 0; a new seed makes a new pool (EnvPool seeds
        only at creation)."""
        if seed is not None and seed % _SEED_RANGE != self.batch.seed:
            self.batch.close()
            self.batch = EnvPoolBatch(self.task, 1, seed, self.kwargs)
        self.batch.reset_into(obs_out)

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step with `actions[0]`; an ended episode is reset within the step."""
        ended = self.batch.step_rows(actions, obs_out, self._rewards, self._dones,
                                     self._time_outs)
        return (self._rewards.copy(), self.batch.terminated.copy(), self.batch.truncated.copy(),
                ended[0][1] if ended else [{}])

    def close(self) -> None:
        """Close the pool; safe to call twice."""
        self.batch.close()
