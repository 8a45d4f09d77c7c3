"""PettingZoo parallel envs as `MultiAgentEnv`s (`pettingzoo:<id>`; the `multiagent` extra)."""
