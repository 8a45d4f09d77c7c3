"""A league of past opponents, above learning: the snapshot store, the opponent samplers, the
payoff table with its ratings, the per-match policy mapping and the league actor that ties them
together (docs/ARCHITECTURE.md, "League")."""
