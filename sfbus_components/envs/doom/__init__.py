"""VizDoom: single-player scenarios, duels and matches, their action spaces and shared memory."""
