"""Any registered gymnasium env as a one-agent `MultiAgentEnv`.

Observation: a Box becomes field `obs` (uint8 kept for images, anything else as float32); a
Discrete observation becomes a float32 one-hot, a MultiBinary a float32 vector. A Dict of those
becomes one field per key (e.g. `obs` and an `action_mask`, see `sfbus_components.envs.spec`).
Actions: Discrete -> one head, MultiDiscrete -> one head per entry (`start` offsets are added
back), Box -> `action_box` (float32, passed through unclipped: clipping to the bounds is the
env's or the model's business), a Tuple of Discrete spaces and one Box (in any order) -> a hybrid
action, one head per Discrete and the Box (the env gets the tuple back in its own order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sfbus_components.envs.family import unknown_env
from sfbus_components.envs.spec import (
    ActionBox,
    EnvSpec,
    EpisodeStats,
    MultiAgentEnv,
    ObsDict,
    ObsField,
    StepOutput,
)


class GymEnv(MultiAgentEnv):
    """Adapter around one `gymnasium.Env`; auto-resets it at episode end."""

    def __init__(self, env: gym.Env, seed: int | None = None) -> None:
        self.env = env
        self._seed = seed
        self._fields = _obs_fields(env.observation_space)
        """Field name -> (field, whether it is a Discrete one-hot)."""
        self._is_dict = isinstance(env.observation_space, spaces.Dict)
        heads, box = _action_space(env.action_space)
        self._action = GymAction(env.action_space)
        try:
            self._spec = EnvSpec({k: f for k, (f, _) in self._fields.items()},
                                 action_heads=heads, action_box=box)
        except ValueError as error:  # e.g. an action mask that does not fit the action space
            raise TypeError(str(error)) from None
        self._stats = EpisodeStats(1, 1)

    @property
    def spec(self) -> EnvSpec:
        """The env's fixed spec."""
        return self._spec

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Reset the gym env (first reset uses the constructor's seed) into `obs_out` row 0."""
        if seed is None:
            seed, self._seed = self._seed, None
        obs, _ = self.env.reset(seed=seed)
        self._write(obs, obs_out)
        self._stats.clear()

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step with `actions[0]`; on episode end reset and report the episode in the info."""
        obs, reward, term, trunc, info = self.env.step(self._action(actions[0]))
        info = dict(info)
        self._stats.add(reward)
        if term or trunc:
            self._stats.finish(0, info)
            obs, _ = self.env.reset()
        self._write(obs, obs_out)
        return (np.array([reward], np.float32), np.array([bool(term)]),
                np.array([bool(trunc)]), [info])

    def close(self) -> None:
        """Close the gym env."""
        self.env.close()

    def _write(self, obs: Any, obs_out: ObsDict) -> None:
        if not self._is_dict:
            obs = {"obs": obs}
        for key, (_, one_hot) in self._fields.items():
            row = obs_out[key][0]
            if one_hot:
                row[:] = 0.0
                row[int(obs[key])] = 1.0
            else:
                np.copyto(row, obs[key], casting="unsafe")


class GymAction:
    """One agent's action row (spec.py's layout) -> the action of gymnasium ``space``, one of
    those :func:`_action_space` accepts."""

    def __init__(self, space: spaces.Space) -> None:
        self.kind = type(space).__name__  # "Discrete", "MultiDiscrete", "Box" or "Tuple"
        self.start = np.asarray(getattr(space, "start", 0))
        self.shape = space.shape
        if isinstance(space, spaces.Tuple):
            self.start = np.asarray([int(sub.start) for sub in space.spaces
                                     if isinstance(sub, spaces.Discrete)])
            self.box_at = next(i for i, sub in enumerate(space.spaces)
                               if isinstance(sub, spaces.Box))
            self.shape = space.spaces[self.box_at].shape

    def __call__(self, a: np.ndarray) -> Any:
        """The gymnasium action of row ``a``."""
        if self.kind == "Discrete":
            return int(a[0]) + int(self.start)
        if self.kind == "MultiDiscrete":
            return (a.reshape(self.shape) + self.start).astype(np.int64)
        if self.kind == "Tuple":  # the heads' whole numbers, then the Box (spec.py)
            heads = len(self.start)
            parts: list[Any] = [int(c) for c in a[:heads].astype(np.int64) + self.start]
            parts.insert(self.box_at, a[heads:].reshape(self.shape).astype(np.float32))
            return tuple(parts)
        return a.astype(np.float32, copy=False)


def _obs_fields(space: spaces.Space) -> dict[str, tuple[ObsField, bool]]:
    """The fields of an observation space: ``obs``, or one per key of a Dict."""
    if isinstance(space, spaces.Dict):
        if not space.spaces:
            raise TypeError("an empty gymnasium Dict observation space")
        return {str(key): _obs_field(sub) for key, sub in space.spaces.items()}
    return {"obs": _obs_field(space)}


def _obs_field(space: spaces.Space) -> tuple[ObsField, bool]:
    if isinstance(space, spaces.MultiBinary) and len(space.shape) == 1:
        return ObsField(tuple(space.shape), "float32"), False
    if isinstance(space, spaces.Box):
        dtype = "uint8" if space.dtype == np.uint8 else "float32"
        return ObsField(tuple(space.shape), dtype), False
    if isinstance(space, spaces.Discrete):
        return ObsField((int(space.n),), "float32"), True
    raise TypeError(f"unsupported gymnasium observation space {space}; use Box, Discrete, "
                    "MultiBinary or a Dict of them")


def _action_space(space: spaces.Space) -> tuple[tuple[int, ...], ActionBox | None]:
    if type(space) is spaces.Discrete:
        return (int(space.n),), None
    if type(space) is spaces.MultiDiscrete:
        return tuple(int(n) for n in space.nvec.reshape(-1)), None
    if type(space) is spaces.Box:
        box = ActionBox(tuple(float(x) for x in space.low.reshape(-1)),
                        tuple(float(x) for x in space.high.reshape(-1)), tuple(space.shape))
        return (), box
    if type(space) is spaces.Tuple:
        return _tuple_action_space(space)
    raise TypeError(f"unsupported gymnasium action space {space}; use Discrete, "
                    "MultiDiscrete, Box or a Tuple of Discrete spaces and one Box")


def _tuple_action_space(space: spaces.Tuple) -> tuple[tuple[int, ...], ActionBox]:
    """A hybrid action: the Tuple's Discrete spaces as heads (in order), its one Box."""
    heads: list[int] = []
    box = None
    for i, sub in enumerate(space.spaces):
        if type(sub) is spaces.Discrete:
            heads.append(int(sub.n))
        elif type(sub) is spaces.Box and box is None:
            box = _action_space(sub)[1]
        else:
            what = "a second Box" if type(sub) is spaces.Box else str(sub)
            raise TypeError(f"unsupported gymnasium action space {space}: item {i} is {what}; "
                            "a Tuple action must be Discrete spaces and one Box")
    if not heads or box is None:
        raise TypeError(f"unsupported gymnasium action space {space}: a Tuple action must be "
                        "at least one Discrete space and one Box")
    return tuple(heads), box


def make_gym_env(env_id: str, seed: int | None = None, **kwargs: Any) -> GymEnv:
    """Create gymnasium env `env_id` (kwargs go to `gymnasium.make`) as a MultiAgentEnv."""
    return GymEnv(gym.make(env_id, **kwargs), seed=seed)


def resolve(name: str) -> Callable[..., GymEnv]:
    """The factory of `gym:<EnvId>`, any id of gymnasium's registry (the registry's `gym:`
    family)."""
    env_id = name[len("gym:"):]
    if env_id not in gym.envs.registry:
        raise unknown_env(name, [f"gym:{k}" for k in gym.envs.registry])
    return lambda **kwargs: make_gym_env(env_id, **kwargs)
