"""Environments behind one small interface: `make_env(name)` gives a `MultiAgentEnv`.

Names: short names from `register_env` (built in: `toy_multi_agent`) or from the
`sfbus.envs` entry points of installed packages; a family's, by prefix, each family in a folder
of its own: `doom_<scenario>` (VizDoom, e.g. `doom_basic`), `atari_<game>` (ale-py, e.g.
`atari_breakout`), `mujoco_<name>` (gymnasium's MuJoCo, e.g. `mujoco_halfcheetah`),
`gym:<EnvId>` (gymnasium, e.g. `gym:CartPole-v1`), `pettingzoo:<id>`, `envpool:<TaskId>`, or a
user's family (`register_env_family`); or an import path `pkg.module:factory` for a user's own
env (a factory or class giving a `MultiAgentEnv` or a `gymnasium.Env`). Heavy engines load only
when their env is made.
"""

from sfbus_components.envs.checks import EnvSpecError
from sfbus_components.envs.family import EnvFamily, EnvNotInstalledError, UnknownEnvError
from sfbus_components.envs.registry import (
    env_spec,
    known_envs,
    make_env,
    register_env,
    register_env_family,
)
from sfbus_components.envs.spec import ActionBox, EnvError, EnvSpec, MultiAgentEnv, ObsField

__all__ = [
    "ActionBox",
    "EnvError",
    "EnvFamily",
    "EnvNotInstalledError",
    "EnvSpec",
    "EnvSpecError",
    "MultiAgentEnv",
    "ObsField",
    "UnknownEnvError",
    "env_spec",
    "known_envs",
    "make_env",
    "register_env",
    "register_env_family",
]
