"""Sampling: rollout workers step envs, inference workers run the policy on their observations.
It never imports `sfbus_components.learning`: the two meet in `sfbus_components.datapath`."""
