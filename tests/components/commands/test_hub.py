"""``sfbus push`` / ``pull`` / ``hub:``: the model folder is true to the run, a folder in the Hub's
layout (its cache, as ``snapshot_download`` returns it offline) becomes a run directory that
``eval`` and ``enjoy`` play, and errors are one line.

These machines cannot reach the Hub: no test uploads anything. The upload path is exercised only
as far as the real client refusing in its offline mode.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sfbus import BadInput
from sfbus.cli import main
from tests.components.commands.test_enjoy import episodes
from tests.components.commands.test_eval import read_rows
from tests.short_runs import mean_rewards

ROOT = Path(__file__).resolve().parents[3]
REPO = "me/cartpole"
REVISION = "0123456789abcdef0123456789abcdef01234567"
FRAMES = 1000


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short real CartPole run (a thousand frames; a seed no default has)."""
    run_dir = tmp_path_factory.mktemp("hub") / "run"
    mean_rewards(run_dir, "gym:CartPole-v1", FRAMES, "seed=4242", timeout=120)
    return run_dir


@pytest.fixture(scope="module")
def pushed(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The model folder of ``sfbus push --no-upload --video``, and push's output."""
    folder = tmp_path_factory.mktemp("push") / "folder"
    done = sfbus("push", str(trained_run), "--repo", REPO, "--local-dir", str(folder),
                 "--no-upload", "--video", "--episodes", "6")
    return folder, done.stdout


def sfbus(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    """``sfbus ARGS`` as its own process (the Hub client reads its settings at import)."""
    done = subprocess.run([sys.executable, "-m", "sfbus", *args], capture_output=True, text=True,
                          timeout=90, cwd=cwd, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``sfbus ARGS`` in this process: (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def front_matter(card: str) -> dict:
    """The model card's YAML front matter, as the Hub reads it."""
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def hub_cache(folder: Path, cache: Path) -> Path:
    """Lay ``folder`` out as the Hub client's cache holds a downloaded repository: content in
    ``blobs/``, the revision's files as links to them, ``refs/main`` naming the revision."""
    repo = cache / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return cache


def test_the_folder_is_true_to_the_run(trained_run, pushed, tmp_path, capsys):
    folder, out = pushed
    snapshot = yaml.safe_load((trained_run / "topology.yaml").read_text())
    seed = snapshot["settings"]["seed"]
    assert seed == 4242
    info = json.loads((folder / "sfbus.json").read_text())
    newest = max((trained_run / "checkpoints" / "policy_0").glob("checkpoint_*.pt"))
    assert info["checkpoint"] == f"checkpoints/policy_0/{newest.name}"  # no best under 100k
    assert (folder / info["checkpoint"]).read_bytes() == newest.read_bytes()
    assert (folder / "topology.yaml").read_text() == (trained_run / "topology.yaml").read_text()
    assert (info["env"], info["seed"], info["max_frames"]) == ("gym:CartPole-v1", seed, FRAMES)
    assert (folder / "replay.mp4").stat().st_size > 0
    # frames as the checkpoint counts them, shown by enjoy
    code, enjoyed, err = run_cli(capsys, "enjoy", str(trained_run), "--episodes", "1")
    assert code == 0, err
    assert f"(version {info['version']}, {info['env_frames']:,} env frames)" in enjoyed

    # the card's reward is what `sfbus eval` gives the same checkpoint on the same seeds
    code, _, err = run_cli(capsys, "eval", str(trained_run), "--episodes", "6", "--envs", "4",
                           "--out", str(tmp_path))
    assert code == 0, err
    rows = read_rows(tmp_path / "eval_policy_0.csv")
    mean = float(rows[-1]["return"])
    assert info["mean_reward"] == pytest.approx(mean)
    card = (folder / "README.md").read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "sfbus"
    assert "gym:CartPole-v1" in meta["tags"] and "reinforcement-learning" in meta["tags"]
    result = meta["model-index"][0]["results"][0]
    assert result["dataset"]["name"] == "gym:CartPole-v1"
    assert result["metrics"][0]["type"] == "mean_reward"
    assert result["metrics"][0]["value"] == f"{mean:.2f} +/- {info['std_reward']:.2f}"
    assert f"{info['env_frames']:,} env frames" in card
    assert f"mean reward {mean:.2f}" in out

    # the card's training command runs from the folder and trains the same settings and seed
    command = re.search(r"^sfbus run topology\.yaml (.*)$", card, re.MULTILINE)
    assert command and command[1] == f"--seed {seed} --max-frames {FRAMES}"
    retrained = tmp_path / "again"
    args = command[1].replace(str(FRAMES), "300").split()
    sfbus("run", "topology.yaml", *args, "--serial", "--run-dir", str(retrained), cwd=folder)
    again = yaml.safe_load((retrained / "topology.yaml").read_text())
    assert again["settings"] == snapshot["settings"]


def test_a_folder_in_the_hubs_layout_is_a_run_that_eval_and_enjoy_play(pushed, tmp_path, capsys,
                                                                      monkeypatch):
    from huggingface_hub import constants

    folder, _ = pushed
    cache = hub_cache(folder, tmp_path / "cache")
    # as HF_HUB_CACHE and HF_HUB_OFFLINE=1 set them: the client answers from its cache
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    run_dir = tmp_path / "pulled"
    code, out, err = run_cli(capsys, "pull", REPO, "--run-dir", str(run_dir))
    assert code == 0, err
    assert f"{REPO} -> {run_dir}" in out
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()) == files
    assert not any(p.is_symlink() for p in run_dir.rglob("*"))  # copies, not links to the cache
    code, _, err = run_cli(capsys, "eval", str(run_dir), "--episodes", "3", "--out",
                           str(tmp_path / "csv"))
    assert code == 0, err
    assert len(read_rows(tmp_path / "csv" / "eval_policy_0.csv")) == 4  # three and the mean
    # hub:user/name wherever a run directory is taken: pulled into runs/hub/user/name; in a
    # process of its own, told by the environment variables themselves
    done = sfbus("enjoy", f"hub:{REPO}", "--episodes", "2", cwd=tmp_path,
                 env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert len(episodes(done.stdout)) == 2
    assert (tmp_path / "runs" / "hub" / REPO / "sfbus.json").is_file()
    info = json.loads((folder / "sfbus.json").read_text())
    assert f"(version {info['version']}, {info['env_frames']:,} env frames)" in done.stdout


def test_the_real_client_offline_refuses_the_upload_and_keeps_the_folder(trained_run, tmp_path,
                                                                        capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 sets it
    folder = tmp_path / "folder"
    code, out, err = run_cli(capsys, "push", str(trained_run), "--repo", REPO, "--local-dir",
                             str(folder), "--episodes", "1")
    assert code == 1
    assert re.fullmatch(rf"error: cannot upload {folder} to {REPO}: OfflineModeIsEnabled: .*; "
                        r"the folder is kept \(log in with `hf auth login`, then push again\)\n",
                        err)
    assert (folder / "README.md").is_file() and "not uploaded" not in out


def test_bad_input_is_one_error_line_and_changes_nothing(trained_run, pushed, tmp_path, capsys,
                                                         monkeypatch):
    folder, _ = pushed
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases = [
        (("push", str(trained_run), "--repo", "no repo"), "--repo 'no repo': not a Hub repository"),
        (("push", str(trained_run), "--repo", REPO, "--local-dir", str(foreign), "--no-upload"),
         f"--local-dir {foreign}: the directory is not empty and holds no earlier push"),
        (("push", str(trained_run), "--repo", REPO, "--local-dir", str(trained_run),
          "--no-upload"), f"--local-dir {trained_run}: holds the run itself"),
        (("push", str(trained_run), "--repo", REPO, "--policy", "3", "--no-upload",
          "--local-dir", str(tmp_path / "none")), "--policy 3:"),
        (("pull", "../x"), "sfbus pull '../x': not a Hub repository"),
        (("eval", "hub:a/b/c"), "RUN_DIR 'a/b/c': not a Hub repository"),
    ]
    for args, message in cases:
        code, _, err = run_cli(capsys, *args)
        assert code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "none").exists()

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    missing = ("error: the Hugging Face Hub client is not installed (huggingface_hub); "
               "pip install 'sfbus[tools]'\n")
    for args in (("push", str(trained_run), "--repo", REPO, "--local-dir", str(tmp_path / "n")),
                 ("pull", REPO), ("enjoy", f"hub:{REPO}")):
        assert run_cli(capsys, *args)[::2] == (2, missing)
    assert not (tmp_path / "n").exists()

    # a pulled folder that is not an sfbus model, into a directory holding a run
    from sfbus_components.commands.hub import install_model_folder

    with pytest.raises(BadInput, match=r"me/x: not an sfbus model"):
        install_model_folder(foreign, tmp_path / "any", "me/x")
    with pytest.raises(BadInput, match=r"holds a run of sfbus run"):
        install_model_folder(folder, trained_run, REPO)
    shutil.rmtree(tmp_path / "any", ignore_errors=True)
