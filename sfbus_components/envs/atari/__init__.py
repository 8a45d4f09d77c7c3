"""Atari 2600 games through ale-py (`atari_<game>`; the `atari` extra)."""
