"""Learning: the batcher groups trajectories, the learner trains on them, saves checkpoints and
runs with its peers. It never imports `sfbus_components.sampling`."""
