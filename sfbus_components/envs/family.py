"""Env families: the names that share a prefix (`atari_`, `gym:`, ...), each resolved by one
function of the family's own folder.

`sfbus_components.envs.registry` maps a prefix to an :class:`EnvFamily`: the import path of its
resolver (so nothing heavy loads until one of its envs is named), the modules it needs and the
`pip install` that brings them. A user's family is an `EnvFamily` too, registered the same way
(`register_env_family`, or an `sfbus.env_families` entry point). This module imports nothing of
the families, so that they and the registry can both import it.
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass


class UnknownEnvError(ValueError):
    """The caller named an env that no factory provides; the message lists close names."""


class EnvNotInstalledError(UnknownEnvError):
    """The env's family needs a package that is not installed (or fails to import): the
    install's fault; the message names the `pip install` to run."""


@dataclass(frozen=True)
class EnvFamily:
    """How the registry resolves the env names that start with one prefix."""

    resolve: str
    """Import path ``package.module:function`` of ``resolve(name) -> factory``: the factory of
    env ``name`` (the whole name, prefix included); it raises `UnknownEnvError` for a name of
    the family that it does not know."""
    about: str
    """What the family's names are, for the list an unknown name gets:
    ``"'atari_<game>' for the Atari games of ale-py"``."""
    requires: tuple[str, ...] = ()
    """Modules the family needs, imported before its resolver: one that fails to import is an
    `EnvNotInstalledError` naming `install`."""
    install: str = "sfbus"
    """The pip requirement that installs `requires` (``"sfbus[atari]"``)."""
    names: str = ""
    """Import path of ``names() -> list[str]``, the env names `known_envs` lists; empty for a
    family whose names are open-ended (``gym:<EnvId>``)."""

    def check_installed(self, name: str) -> None:
        """Raise `EnvNotInstalledError` for env ``name`` when a module of `requires` is not
        installed: found without being imported, so cheap enough for every process that reads
        a topology's settings (one that is installed but fails to import is found when the
        env is made)."""
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                raise self.not_installed(name, module, "is not installed")

    def not_installed(self, name: str, module: str, why: str) -> EnvNotInstalledError:
        """The error for env ``name`` whose package ``module`` ``why`` (is not installed, fails
        to import): it names the `pip install` to run."""
        return EnvNotInstalledError(f"env {name!r} needs the package {module}, which {why}: "
                                    f"pip install '{self.install}'")


def unknown_env(name: str, candidates: list[str], *, shown: list[str] | None = None,
                tail: str = "") -> UnknownEnvError:
    """The error for env ``name`` that is none of ``candidates``: a "did you mean" of the close
    ones, then the names ``shown`` (default: the candidates; at most 80) and ``tail``."""
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    listed = candidates if shown is None else shown
    listed = listed if len(listed) <= 80 else [*close, "..."]
    return UnknownEnvError(f"unknown env {name!r}{hint} Known: {', '.join(listed)}{tail}.")
