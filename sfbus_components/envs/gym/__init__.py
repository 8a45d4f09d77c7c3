"""Any gymnasium env as a `MultiAgentEnv`: `gym:<EnvId>`, and what a factory returns as a
`gymnasium.Env`."""
