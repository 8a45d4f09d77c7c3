"""Heterogeneous agents: the policy of each agent of a named-agent env, fixed for the run.

The data-path setting ``agent_policies`` maps an env's agents (``EnvSpec.agent_names``, a
PettingZoo env's ``possible_agents``) to policies: each key is a name or an ``fnmatch`` pattern
(``adversary_*``), and the first key that matches an agent, in the file's order, gives its policy.
Every agent must match a key, every key an agent, and every policy ``0..num_policies-1`` must act
for at least one agent. The agents of one policy must share one observation and action space, as
the policy has one model: a mapping that sends an agent to a policy of another space is refused
here, at validation. Each policy then has a spec of its own (its agents' spaces, ``num_agents``
their count per env), which sizes its observation and action arrays
(:mod:`sfbus_components.datapath.buffers`) and builds its model.

An env whose agents differ in space (``EnvSpec.agent_specs``) needs the mapping; one whose agents
share a space may have one too (agents fixed to policies by name instead of drawn per episode).
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from fnmatch import fnmatchcase

from sfbus_components.envs import EnvSpec


def agent_policy_table(spec: EnvSpec, patterns: dict[str, int]) -> tuple[int, ...]:
    """The policy of each of the env's agents, in row order (``ValueError`` naming what is
    wrong: an agent no key matches, a key that matches no agent)."""
    names = spec.agent_names
    if not names:
        raise ValueError("agent_policies maps agents by name, but the env does not name its "
                         "agents (EnvSpec.agent_names; PettingZoo envs do)")
    # a misspelt key first: it explains the agent no key matches
    for key in patterns:
        if not any(fnmatchcase(name, key) for name in names):
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"agent_policies: key {key!r} matches none of the env's agents "
                             f"({', '.join(names)}){hint}")
    table = []
    for name in names:
        policy = next((p for key, p in patterns.items() if fnmatchcase(name, key)), None)
        if policy is None:
            raise ValueError(f"agent_policies: no key matches agent {name!r}; the env's agents "
                             f"are {', '.join(names)}")
        table.append(policy)
    return tuple(table)


def agent_spec(spec: EnvSpec, agent: int) -> EnvSpec:
    """Agent ``agent``'s own spaces as a one-agent spec."""
    if spec.agent_specs:
        return spec.agent_specs[agent]
    return EnvSpec(spec.observation_space, spec.action_heads, spec.action_box)


def policy_specs(spec: EnvSpec, table: tuple[int, ...], num_policies: int) -> tuple[EnvSpec, ...]:
    """Each policy's spec: its agents' shared spaces, ``num_agents`` their count per env
    (``ValueError`` where a policy's agents differ in space, then for a policy with no agent)."""
    specs = []
    for policy in range(num_policies):
        agents = [a for a, p in enumerate(table) if p == policy]
        if not agents:
            continue
        first = agent_spec(spec, agents[0])
        for a in agents[1:]:
            other = agent_spec(spec, a)
            if not other.spaces_equal(first):
                names = spec.agent_names
                raise ValueError(
                    f"agent_policies: agent {names[a]!r} ({other.describe_spaces()}) is mapped "
                    f"to policy {policy}, whose agent {names[agents[0]]!r} has "
                    f"{first.describe_spaces()}; a policy has one model, so its agents must "
                    f"share one space: map {names[a]!r} to a policy of its own space")
        specs.append(replace(first, num_agents=len(agents), frameskip=spec.frameskip,
                             reward_scale=spec.reward_scale))
    if len(specs) < num_policies:
        missing = min(set(range(num_policies)) - set(table))
        raise ValueError(f"agent_policies: policy {missing} acts for no agent; every policy "
                         f"0..{num_policies - 1} (settings.num_policies) needs at least one")
    return tuple(specs)


def resolve_agent_policies(spec: EnvSpec, patterns: dict[str, int],
                           num_policies: int) -> tuple[tuple[int, ...], tuple[EnvSpec, ...]]:
    """The policy of each agent and each policy's spec, both empty without a mapping
    (``ValueError`` for a heterogeneous env without one, or a mapping that does not fit)."""
    if not patterns:
        if spec.heterogeneous:
            raise ValueError(
                "the env's agents differ in observation or action space ("
                + "; ".join(f"{name}: {s.describe_spaces()}"
                            for name, s in zip(spec.agent_names, spec.agent_specs, strict=True))
                + "): map each agent to a policy of its space with agent_policies "
                "(docs/ENVIRONMENTS.md)")
        return (), ()
    table = agent_policy_table(spec, patterns)
    return table, policy_specs(spec, table, num_policies)
