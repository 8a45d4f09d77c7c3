"""Scoring policies outside training: the evaluator actor and the episode loops."""
