"""Population-based training, above learning: the trainer actor, its rules, and a member of a
population across machines (a learner's own part is
:mod:`sfbus_components.learning.population_member`)."""
