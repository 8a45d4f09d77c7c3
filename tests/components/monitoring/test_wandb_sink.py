"""W&B online without a login is refused at validation, not a crash-looping learner."""

from __future__ import annotations

from pathlib import Path

import pytest

from sfbus.cli import main

CARTPOLE = str(Path(__file__).parents[3] / "topologies" / "cartpole.yaml")


@pytest.fixture
def no_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment where wandb finds no credentials (an empty .netrc, no key)."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def test_online_without_a_login_is_one_located_error(no_login: Path, capsys) -> None:
    # was: ok, then wandb.init's UsageError in every start of the learner's process until the
    # run failed after max_restarts with "process learner exited with code 1"
    assert main(["validate", CARTPOLE, "--set", "wandb.project=x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: --set: settings.wandb: ")
    assert "wandb.mode online needs a W&B login" in err and "wandb.mode=offline" in err


def test_offline_or_a_login_is_valid(no_login: Path, monkeypatch, capsys) -> None:
    assert main(["validate", CARTPOLE, "--set", "wandb.project=x",
                 "--set", "wandb.mode=offline"]) == 0
    no_login.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    no_login.chmod(0o600)
    assert main(["validate", CARTPOLE, "--set", "wandb.project=x"]) == 0
    no_login.write_text("")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert main(["validate", CARTPOLE, "--set", "wandb.project=x"]) == 0
    # nothing but validate's notes on settings Sample Factory names too (no error, no warning)
    assert all(line.startswith("note: ") for line in capsys.readouterr().err.splitlines())
