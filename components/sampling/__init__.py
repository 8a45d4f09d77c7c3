"""Sampling: rollout workers step envs, inference workers run the policy on their observations.
It never imports `components.learning`: the two meet in `components.datapath`."""
