"""What a run reports: the statistics actor and status line, TensorBoard and W&B."""
