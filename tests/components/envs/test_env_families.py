"""Env families: the registry's table of prefixes, a user's family registered like a built-in,
and a family whose package is missing named with the pip install that brings it (located at
validation, exit 2). Packages are blocked, not uninstalled: `sys.modules[name] = None` makes
their import fail as a missing one does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sfbus import import_object
from sfbus_components.envs import (
    EnvFamily,
    EnvNotInstalledError,
    UnknownEnvError,
    known_envs,
    make_env,
    register_env_family,
    registry,
)
from sfbus_components.envs.multi_agent import ToyMultiAgentEnv

ROOT = Path(__file__).parents[3]
GUESS = EnvFamily("tests.components.envs.test_env_families:resolve_guess",
                  "'guess:<agents>' for the toy env with that many agents",
                  names="tests.components.envs.test_env_families:guess_names")


def resolve_guess(name: str) -> object:
    """The test family's resolver: `<prefix><agents>`, 1 to 3 agents, whatever the prefix."""
    agents = name.rpartition(":")[2]
    if agents not in ("1", "2", "3"):
        raise UnknownEnvError(f"unknown env {name!r}: guess:1 to guess:3")
    return lambda **kwargs: ToyMultiAgentEnv(num_agents=int(agents), **kwargs)


def guess_names() -> list[str]:
    """The names the test family lists."""
    return ["guess:1", "guess:2", "guess:3"]


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations of a test stay in it (the registry's dict and the carried variable)."""
    monkeypatch.setattr(registry, "_FAMILIES", {})
    monkeypatch.delenv(registry.CARRIED_FAMILIES, raising=False)


@pytest.mark.parametrize("prefix", sorted(registry.FAMILIES))
def test_every_built_in_family_names_importable_functions(prefix: str) -> None:
    family = registry.FAMILIES[prefix]
    for path in filter(None, (family.resolve, family.names)):
        assert callable(import_object(path)), path
    assert family.install.startswith("sfbus") and family.about.startswith(f"'{prefix}")


@pytest.mark.parametrize(("name", "blocked", "install"), [
    ("doom_basic", "vizdoom", "sfbus[doom]"),
    ("doom_duel", "vizdoom", "sfbus[doom]"),
    ("doom:arena.cfg", "cv2", "sfbus[doom]"),
    ("atari_breakout", "ale_py", "sfbus[atari]"),
    ("mujoco_halfcheetah", "mujoco", "sfbus[mujoco]"),
    ("pettingzoo:mpe2.simple_spread_v3", "pettingzoo", "sfbus[multiagent]"),
    ("pettingzoo:mpe2.simple_spread_v3", "mpe2", "sfbus[multiagent]"),
    ("envpool:Pong-v5", "envpool", "sfbus[envpool]"),
])
def test_a_missing_family_package_names_its_extra(
        monkeypatch: pytest.MonkeyPatch, name: str, blocked: str, install: str) -> None:
    for loaded in [m for m in sys.modules if m == blocked or m.startswith(blocked + ".")]:
        monkeypatch.setitem(sys.modules, loaded, None)  # its submodules too, if imported before
    monkeypatch.setitem(sys.modules, blocked, None)
    with pytest.raises(EnvNotInstalledError) as error:
        make_env(name)
    assert str(error.value) == (f"env {name!r} needs the package {blocked}, which is not "
                                f"installed: pip install '{install}'")


def test_a_missing_extra_is_one_located_error_at_validation(tmp_path: Path) -> None:
    # at the `env:` that named the env, in the file that set it: the base file's through
    # `extends:`, a child's own where it sets one
    inherits, sets = tmp_path / "inherits.yaml", tmp_path / "sets.yaml"
    base = ROOT / "topologies" / "atari_breakout.yaml"
    inherits.write_text(f"extends: {base}\nsettings:\n  num_envs: 4\n")
    sets.write_text(f"extends: {base}\nsettings:\n  num_envs: 4\n  env: atari_pong\n")
    blocked = ("import sys; sys.modules['ale_py'] = None; from sfbus.cli import main; "
               "sys.exit(max(main(['validate', f]) for f in sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", blocked, "topologies/atari_breakout.yaml",
                             str(inherits), str(sets)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 3, result.stderr
    env_line = base.read_text().splitlines().index("  env: atari_breakout") + 1
    expected = [(f"topologies/atari_breakout.yaml:{env_line}:8", "breakout"),
                (f"{base}:{env_line}:8", "breakout"), (f"{sets}:4:8", "pong")]
    for line, (where, game) in zip(lines, expected, strict=True):
        assert line == (f"error: {where}: settings.env: env 'atari_{game}' needs the package "
                        "ale_py, which is not installed: pip install 'sfbus[atari]' (parameter "
                        "'env' of actor 'rollout')"), line


@pytest.mark.usefixtures("clean_registry")
def test_a_users_family_resolves_lists_and_reaches_child_processes() -> None:
    with pytest.raises(UnknownEnvError, match="cannot import module 'guess'"):
        make_env("guess:2")  # before the family: read as an import path
    register_env_family("guess:", GUESS)
    with make_env("guess:2", episode_length=4) as env:
        assert env.spec.num_agents == 2
    assert {"guess:1", "guess:3"} <= set(known_envs())
    with pytest.raises(UnknownEnvError, match="guess:1 to guess:3"):
        make_env("guess:9")
    with pytest.raises(UnknownEnvError, match="'guess:<agents>' for the toy env"):
        make_env("nothing_like_it")
    carried = json.loads(os.environ[registry.CARRIED_FAMILIES])
    assert carried["guess:"]["resolve"] == GUESS.resolve
    child = ("from sfbus_components.envs import make_env; "
             "print(make_env('guess:3').spec.num_agents)")
    result = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.strip() == "3", result.stderr


@pytest.mark.usefixtures("clean_registry")
def test_a_users_family_takes_a_built_in_prefix_and_names_its_own_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    register_env_family("gym:", EnvFamily(GUESS.resolve, "mine", ("guess_engine",),
                                          "guess-envs[fast]"))
    with pytest.raises(EnvNotInstalledError,
                       match=r"needs the package guess_engine, which is not installed: "
                             r"pip install 'guess-envs\[fast\]'"):
        make_env("gym:CartPole-v1")
    monkeypatch.setitem(sys.modules, "guess_engine", sys)  # any module: the engine "imports"
    with make_env("gym:1") as env:
        assert isinstance(env, ToyMultiAgentEnv)


def test_a_bad_family_is_refused() -> None:
    with pytest.raises(TypeError, match="non-empty prefix and an EnvFamily"):
        register_env_family("", GUESS)


@pytest.mark.parametrize(("old", "new"), [
    ("sfbus_components.envs.atari:AtariEnv", "sfbus_components.envs.atari.game:AtariEnv"),
    ("sfbus_components.envs.mujoco:make_mujoco_env",
     "sfbus_components.envs.mujoco.tasks:make_mujoco_env"),
    ("sfbus_components.envs.envpool_env:EnvPoolFactory",
     "sfbus_components.envs.envpool.pool:EnvPoolFactory"),
    ("sfbus_components.envs.gym_adapter:make_gym_env",
     "sfbus_components.envs.gym.adapter:make_gym_env"),
    ("sfbus_components.envs.pettingzoo_adapter:pettingzoo_factory",
     "sfbus_components.envs.pettingzoo.adapter:pettingzoo_factory"),
    ("components.envs.atari:make_atari_env", "sfbus_components.envs.atari.game:make_atari_env"),
])
def test_a_path_from_before_the_families_moved_still_imports(old: str, new: str) -> None:
    assert import_object(old) is import_object(new)
