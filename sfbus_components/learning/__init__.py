"""Learning: the batcher groups trajectories, the learner trains on them, saves checkpoints,
runs with its peers and plays its part in a population. It never imports
`sfbus_components.sampling` nor `sfbus_components.pbt`."""
