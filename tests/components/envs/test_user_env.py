"""A user's own env: import paths (gymnasium class, gym factory, MultiAgentEnv factory), the
spec checked at validation, registrations that reach other processes.

The user's module lives in `userenv_app/`, a folder that is not on the import path: the CLI
finds it only because it runs there (its working directory), as a user runs `sfbus` in theirs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sfbus
from sfbus_components.envs import (
    EnvSpecError,
    MultiAgentEnv,
    env_spec,
    make_env,
    register_env,
    registry,
)
from sfbus_components.envs.checks import import_path
from sfbus_components.envs.multi_agent import make_toy_env

APP = Path(__file__).parent / "userenv_app"
ROOT = Path(__file__).parents[3]


def sfbus_cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The `sfbus` console script (which, unlike `python -m`, does not put the working directory
    on the import path itself) run in `cwd`."""
    script = Path(sys.executable).parent / "sfbus"
    environ = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(script), *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test are undone after it (here and in os.environ)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_LOCAL_ONLY", {})
    monkeypatch.delenv(registry.CARRIED_ENVS, raising=False)


@pytest.fixture
def app_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(APP))


def test_the_user_module_is_not_importable_from_the_test_process() -> None:
    # What the CLI tests below rely on: only the working directory makes it importable.
    with pytest.raises(ImportError):
        __import__("userenv_demo_envs")


@pytest.mark.usefixtures("app_on_path")
@pytest.mark.parametrize("path", ["userenv_demo_envs:GuessEnv", "userenv_demo_envs:make_guess"])
def test_a_gymnasium_class_or_factory_by_import_path_is_adapted(path: str) -> None:
    with make_env(path) as env:
        assert isinstance(env, MultiAgentEnv)
        assert env.spec.observation_space["obs"].shape == (4,)
        assert env.spec.action_heads == (4,)
        (obs,) = env.reset(seed=3)
        target = int(np.argmax(obs["obs"]))
        _, rewards, _, _, _ = env.step(np.array([[target]]))
        assert rewards.tolist() == [1.0]  # the action reached the gym env unchanged


@pytest.mark.usefixtures("app_on_path")
def test_a_factory_returning_a_multi_agent_env_is_used_as_it_is() -> None:
    with make_env("userenv_demo_envs:make_toy", num_agents=3) as env:
        assert type(env).__name__ == "ToyMultiAgentEnv" and env.spec.num_agents == 3


@pytest.mark.usefixtures("app_on_path")
@pytest.mark.parametrize(("factory", "expected"), [
    ("make_float64", "reset() returned observation 'obs' with dtype float64, but its "
                     "observation_space declares dtype float32"),
    ("make_short", "reset() returned observation 'obs' with shape [3], but its "
                   "observation_space declares shape [4]"),
    ("make_text_actions", "unsupported gymnasium action space Text("),
    ("make_dict_declared", "reset() returned observation 'obs' with a ndarray, but its "
                           "observation_space declares a dict of keys ['obs']"),
    ("make_wrong_writes", "reset_into raised ValueError: could not broadcast input array from "
                          "shape (3,) into shape (4,)"),
    ("make_broken", "creating it raised RuntimeError: the simulator licence is missing"),
    ("make_not_an_env", "its factory returned a dict, not a gymnasium.Env or a "
                        "sfbus_components.envs.MultiAgentEnv"),
])
def test_env_spec_refuses_an_env_that_does_not_match_its_spec(factory: str,
                                                              expected: str) -> None:
    name = f"userenv_demo_envs:{factory}"
    with pytest.raises(EnvSpecError) as error:
        env_spec(name)
    assert str(error.value).startswith(f"env {name!r}: ")
    assert expected in str(error.value)


class _ExtraRewards(MultiAgentEnv):
    spec = make_toy_env(num_agents=2).spec

    def reset_into(self, obs_out, seed=None):
        obs_out["obs"][:] = 0.0

    def step_into(self, actions, obs_out):
        return np.zeros(3, np.float32), np.zeros(2, bool), np.zeros(2, bool), [{}, {}]

    def close(self):
        pass


class _ReplacedArray(_ExtraRewards):
    def reset_into(self, obs_out, seed=None):
        obs_out["obs"] = np.zeros((2, 4), np.float64)


@pytest.mark.parametrize(("cls", "expected"), [
    (_ExtraRewards, "step_into returned rewards of shape [3], expected [2] (one per agent)"),
    (_ReplacedArray, "after reset_into observation field 'obs' is float64 [2, 4], but its spec "
                     "declares float32 [2, 4]"),
])
def test_env_spec_checks_what_a_multi_agent_env_returns(cls: type, expected: str,
                                                        clean_registry: None) -> None:
    register_env("checked", cls)
    with pytest.raises(EnvSpecError, match=f"^env 'checked': {re.escape(expected)}"):
        env_spec("checked")


def test_a_registration_is_carried_by_import_path_to_processes_started_later(
        clean_registry: None) -> None:
    register_env("carried_toy", make_toy_env)
    assert json.loads(os.environ[registry.CARRIED_ENVS]) == {
        "carried_toy": "sfbus_components.envs.multi_agent:make_toy_env"}
    code = ("from sfbus_components.envs import make_env; "
            "print(make_env('carried_toy').spec.num_agents)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"


def test_a_factory_no_other_process_can_import_is_refused_by_name(clean_registry: None,
                                                                  tmp_path: Path) -> None:
    def local_factory() -> MultiAgentEnv:
        return make_toy_env()

    register_env("local_lambda", lambda: make_toy_env())
    register_env("local_function", local_factory)
    assert registry.CARRIED_ENVS not in os.environ or json.loads(
        os.environ[registry.CARRIED_ENVS]) == {}
    with make_env("local_lambda") as env:  # fine in this process
        assert env.spec.num_agents == 2
    with pytest.raises(sfbus.TopologyError) as error:
        sfbus.run(APP / "user_env.yaml", ["env=local_function"], run_dir=tmp_path / "run")
    assert ("env 'local_function' is registered with tests.components.envs.test_user_env."
            "test_a_factory_no_other_process_can_import_is_refused_by_name.<locals>."
            "local_factory, which") in str(error.value)
    assert "other processes cannot import" in str(error.value)
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_import_path_refuses_what_another_process_cannot_import() -> None:
    def nested() -> None:
        pass

    def make() -> None:
        pass

    make.__module__, make.__qualname__ = "__main__", "make"  # as if defined in a script
    assert import_path(make_toy_env) == "sfbus_components.envs.multi_agent:make_toy_env"
    assert import_path(nested) is None
    assert import_path(make) is None
    assert import_path(lambda: None) is None


@pytest.mark.parametrize(("factory", "expected"), [
    ("make_float64", "env 'userenv_demo_envs:make_float64': reset() returned observation 'obs' "
                     "with dtype float64, but its observation_space declares dtype float32"),
    ("make_broken", "env 'userenv_demo_envs:make_broken': creating it raised RuntimeError: "
                    "the simulator licence is missing"),
])
def test_sfbus_validate_gives_a_located_one_line_error_with_exit_2(factory: str,
                                                                   expected: str) -> None:
    done = sfbus_cli("validate", "user_env.yaml", "--set", f"env=userenv_demo_envs:{factory}",
                     cwd=APP)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("error: ") and ".yaml:" in line and "actor 'rollout'" in line
    assert expected in line
