"""What sampling and learning share: the settings, message payloads and buffer layouts of the
data path, and the slot bookkeeping that survives a restart."""
