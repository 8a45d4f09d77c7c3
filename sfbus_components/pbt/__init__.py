"""Population-based training: the trainer actor, its rules and a learner's population role."""
