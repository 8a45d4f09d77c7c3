"""Environments behind one small interface: `make_env(name)` gives a `MultiAgentEnv`.

Names: `doom_<scenario>` (VizDoom, e.g. `doom_basic`), `atari_<game>` (ale-py, e.g.
`atari_breakout`), `mujoco_<name>` (gymnasium's MuJoCo, e.g. `mujoco_halfcheetah`),
`gym:<EnvId>` (gymnasium, e.g. `gym:CartPole-v1`), short names from
`register_env` (built in: `toy_multi_agent`), or an import path `pkg.module:factory` for a
user's own env. Heavy engines load only when their env is made.
"""

from components.envs.registry import (
    UnknownEnvError,
    env_spec,
    known_envs,
    make_env,
    register_env,
)
from components.envs.spec import ActionBox, EnvError, EnvSpec, MultiAgentEnv, ObsField

__all__ = [
    "ActionBox",
    "EnvError",
    "EnvSpec",
    "MultiAgentEnv",
    "ObsField",
    "UnknownEnvError",
    "env_spec",
    "known_envs",
    "make_env",
    "register_env",
]
