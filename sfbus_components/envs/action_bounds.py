"""Continuous actions mapped into the env's Box on their way to it (`model.action_bounds`).

The policy samples from an unbounded Gaussian; the trajectory buffer keeps that sample and its
log-probability, so the learner's ratio pi(a|x) / mu(a|x) is taken on what was sampled. Only the
env sees the mapped action:

- `none`: the sample as it is (Sample Factory's behaviour; MuJoCo clamps its controls itself,
  but its control cost sees the raw action);
- `clip`: `clip(a, low, high)` (CleanRL's and gymnasium's `ClipAction`);
- `squash`: `low + (tanh(a) + 1) (high - low) / 2`, every bound reached only in the limit.

Clipping and squashing are fixed maps of the sample, so the ratio on the sample is the ratio on
the mapped action (a Jacobian that does not depend on the policy cancels). A categorical env
passes through unchanged; of a hybrid action (heads, then a Box) only the Box part is mapped.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from sfbus_components.envs.spec import EnvSpec, EnvWrapper, MultiAgentEnv, ObsDict, StepOutput

ActionBounds = Literal["none", "clip", "squash"]


class ActionMap:
    """The map of `mode` onto the bounds of `spec`'s Box, applied to `[n, *shape]` actions."""

    def __init__(self, spec: EnvSpec, mode: ActionBounds) -> None:
        box = spec.action_box
        if box is None:
            raise ValueError("action bounds apply to continuous actions only")
        self.mode = mode
        self.heads = len(spec.action_heads)
        """Leading entries of an action that are categorical choices (hybrid), left as they are."""
        shape = (spec.box_size,) if self.heads else box.shape  # a hybrid action is flat
        self.low = np.asarray(box.low, np.float32).reshape(shape)
        self.high = np.asarray(box.high, np.float32).reshape(shape)
        if mode == "squash" and not (np.isfinite(self.low).all() and np.isfinite(self.high).all()):
            raise ValueError("model.action_bounds: squash needs finite action bounds, but the "
                             f"env's Box is [{box.low}, {box.high}]; use clip or none")
        self.half = (self.high - self.low) / 2

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        """The actions the env gets (a new array: the sampled ones stay as they are)."""
        if self.heads:
            out = actions.copy()
            out[:, self.heads:] = self._map(actions[:, self.heads:])
            return out
        return self._map(actions)

    def _map(self, actions: np.ndarray) -> np.ndarray:
        if self.mode == "clip":
            return np.clip(actions, self.low, self.high)
        if self.mode == "squash":
            return self.low + (np.tanh(actions) + 1.0) * self.half
        return actions


class BoundedActions(EnvWrapper):
    """An env whose continuous actions pass through an :class:`ActionMap` first."""

    def __init__(self, env: MultiAgentEnv, mode: ActionBounds) -> None:
        super().__init__(env)
        self.map = ActionMap(env.spec, mode)

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Reset the wrapped env."""
        self.env.reset_into(obs_out, seed=seed)

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step the wrapped env with the mapped actions."""
        return self.env.step_into(self.map(actions), obs_out)

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()


class BoundedAgentActions(EnvWrapper):
    """A heterogeneous env (one action array per agent) whose agents with a Box have their
    actions mapped by their own spec's bounds."""

    def __init__(self, env: MultiAgentEnv, mode: ActionBounds) -> None:
        super().__init__(env)
        self.maps = [ActionMap(spec, mode) if spec.is_continuous else None
                     for spec in env.spec.agent_specs]

    def step_into(self, actions: Any, obs_out: Any) -> StepOutput:
        """Step the wrapped env with each agent's mapped action."""
        mapped = [a if m is None else m(a[None])[0]
                  for m, a in zip(self.maps, actions, strict=True)]
        return self.env.step_into(mapped, obs_out)

    def reset_into(self, obs_out: Any, seed: int | None = None) -> None:
        """Reset the wrapped env."""
        self.env.reset_into(obs_out, seed=seed)

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()


def bound_actions(env: MultiAgentEnv, mode: ActionBounds) -> MultiAgentEnv:
    """`env` with its continuous actions mapped by `mode`; itself when nothing is to map."""
    spec = env.spec
    if spec.heterogeneous:
        if mode == "none" or not any(s.is_continuous for s in spec.agent_specs):
            return env
        return BoundedAgentActions(env, mode)
    if mode == "none" or not spec.is_continuous:
        return env
    return BoundedActions(env, mode)
