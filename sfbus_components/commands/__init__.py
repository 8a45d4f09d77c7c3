"""``sfbus`` sub-commands of the RL components (registered under ``sfbus.commands``)."""
