"""MuJoCo continuous-control envs (gymnasium's v5, the `mujoco` package) by Sample Factory's names.

`mujoco_<name>` is gymnasium's env through :mod:`sfbus_components.envs.gym.adapter`: observations a
float32 vector `obs`, actions a Box (bounded by `model.action_bounds`, see
:mod:`sfbus_components.envs.action_bounds`), episodes cut at 1000 steps (`truncated`: see
`appo.value_bootstrap`). Keyword arguments go to `gymnasium.make` (`max_episode_steps`,
`ctrl_cost_weight`, ...). `gym:HalfCheetah-v5` names the same env.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sfbus import RateLimitedLog
from sfbus_components.envs.family import unknown_env

if TYPE_CHECKING:
    from sfbus_components.envs.gym.adapter import GymEnv

# Sample Factory's names (sf_examples/mujoco/mujoco_utils.py), on gymnasium's current versions.
MUJOCO_ENVS = {
    "mujoco_ant": "Ant-v5",
    "mujoco_doublependulum": "InvertedDoublePendulum-v5",
    "mujoco_halfcheetah": "HalfCheetah-v5",
    "mujoco_hopper": "Hopper-v5",
    "mujoco_humanoid": "Humanoid-v5",
    "mujoco_pendulum": "InvertedPendulum-v5",
    "mujoco_pusher": "Pusher-v5",
    "mujoco_reacher": "Reacher-v5",
    "mujoco_standup": "HumanoidStandup-v5",
    "mujoco_swimmer": "Swimmer-v5",
    "mujoco_walker": "Walker2d-v5",
}


def mujoco_names() -> list[str]:
    """The `mujoco_<name>` env names, sorted."""
    return sorted(MUJOCO_ENVS)


def resolve(name: str) -> Callable[..., GymEnv]:
    """The factory of `mujoco_<name>` (the registry's `mujoco_` family)."""
    if name not in MUJOCO_ENVS:
        raise unknown_env(name, mujoco_names())
    return lambda **kwargs: make_mujoco_env(name, **kwargs)


def make_mujoco_env(name: str, seed: int | None = None, **kwargs: Any) -> GymEnv:
    """Create MuJoCo env `name` (a key of `MUJOCO_ENVS`) as a MultiAgentEnv."""
    try:
        import mujoco  # named here, not as an error deep inside gymnasium
    except ImportError as e:
        raise ValueError(f"env {name!r} needs the mujoco package ({e}); "
                         "pip install 'sfbus[mujoco]'") from e
    from sfbus_components.envs.gym.adapter import make_gym_env

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_warn)

    return make_gym_env(MUJOCO_ENVS[name], seed=seed, **kwargs)


_log = logging.getLogger(__name__)
_LIMITED = RateLimitedLog(_log, interval_s=600.0)


def _warn(text: str) -> None:
    # MuJoCo prints its warnings on stderr from C: with mujoco 4, one for every HalfCheetah made
    # (gymnasium's model uses the deprecated `settotalmass`, nothing a user can act on). Into the
    # log instead: deprecations at debug level, the rest rate-limited per kind (the text before
    # its first colon).
    if "deprecated" in text:
        _log.debug("mujoco: %s", text)
    else:
        _LIMITED.warning(text.split(":")[0][:60], "mujoco: %s", text)
