"""A trained policy on the Hugging Face Hub: the folder's layout, its download, ``hub:`` names.

A model folder (what ``sfbus push`` uploads and ``snapshot_download`` returns) is laid out as a
run directory, so that ``enjoy``, ``eval`` and ``export`` read it as they read a run's::

    README.md                               the model card (YAML front matter the Hub reads)
    sfbus.json                              what the card says, for programs (MODEL_INFO)
    topology.yaml                           the run's own topology snapshot: every setting
    checkpoints/policy_<id>/checkpoint_<version>.pt   the policy's weights (one checkpoint)
    replay.mp4                              optional: one episode played by the policy

Wherever a command takes a run directory, ``hub:user/name`` downloads that repository (the Hub
client keeps its own cache) and copies it into ``runs/hub/user/name`` (:func:`run_directory`).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from sfbus import BadInput, SfbusError

HUB_PREFIX = "hub:"
MODEL_INFO = "sfbus.json"
"""The folder's description for programs: env, policy, checkpoint, frames, reward, seed."""
VIDEO = "replay.mp4"
PULLED_ROOT = Path("runs") / "hub"
"""Where ``hub:user/name`` and ``sfbus pull`` put a repository's run directory by default."""
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def import_hub() -> ModuleType:
    """The ``huggingface_hub`` module; its absence is bad input naming the extra to install."""
    try:
        import huggingface_hub
    except ImportError:
        raise BadInput("the Hugging Face Hub client is not installed (huggingface_hub); "
                       "pip install 'sfbus[tools]'") from None
    return huggingface_hub


def check_repo_id(repo: str, flag: str) -> str:
    """``repo`` as the Hub names a model repository: ``user/name``."""
    if not _REPO_ID.match(repo) or ".." in repo or repo.endswith((".git", ".")):
        raise BadInput(f"{flag} {repo!r}: not a Hub repository name; expected user/name "
                       "(letters, digits, '-', '_', '.')")
    return repo


def run_directory(given: str) -> Path:
    """The run directory a command's RUN_DIR names: a path, or ``hub:user/name`` (downloaded
    now into ``runs/hub/user/name``)."""
    if not given.startswith(HUB_PREFIX):
        return Path(given)
    repo = check_repo_id(given.removeprefix(HUB_PREFIX), "RUN_DIR")
    run_dir = download(repo, PULLED_ROOT / repo)
    print(f"{given}: run directory {run_dir}", file=sys.stderr)
    return run_dir


def download(repo: str, run_dir: Path) -> Path:
    """Download ``repo`` with ``snapshot_download`` and make ``run_dir`` a copy of it."""
    hub = import_hub()
    try:
        snapshot = Path(hub.snapshot_download(repo_id=repo, library_name="sfbus"))
    except Exception as error:  # the client's errors have no common base (HTTP, offline, OS)
        raise SfbusError(f"cannot download {repo} from the Hub: "
                         f"{type(error).__name__}: {error}") from None
    return install_model_folder(snapshot, run_dir, repo)


def install_model_folder(folder: Path, run_dir: Path, source: str) -> Path:
    """Copy the model folder ``folder`` (as the Hub returns it) into ``run_dir``, a run directory
    ``enjoy``, ``eval`` and ``export`` accept; a directory holding another run is refused."""
    check_model_folder(folder, source)
    if (run_dir / "run.json").exists():
        raise BadInput(f"--run-dir {run_dir}: holds a run of sfbus run; choose another directory")
    if run_dir.exists() and any(run_dir.iterdir()) and not (run_dir / MODEL_INFO).is_file():
        raise BadInput(f"--run-dir {run_dir}: the directory is not empty and holds no pulled "
                       "model; choose a new or empty directory")
    try:
        if (run_dir / "checkpoints").is_dir():  # an older pull: its checkpoints are replaced
            shutil.rmtree(run_dir / "checkpoints")
        # the Hub's cache holds links to its blobs: copy the files themselves
        shutil.copytree(folder, run_dir, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".cache", ".git*"))
    except OSError as error:
        raise SfbusError(f"cannot write {run_dir}: {error.strerror or error}") from None
    return run_dir


def check_model_folder(folder: Path, source: str) -> dict[str, Any]:
    """The folder's :data:`MODEL_INFO`, after checking that it is an sfbus model folder."""
    info_path = folder / MODEL_INFO
    if not (folder / "topology.yaml").is_file() or not info_path.is_file():
        raise BadInput(f"{source}: not an sfbus model (no topology.yaml and {MODEL_INFO}; "
                       "sfbus push writes them)")
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as error:
        raise BadInput(f"{source}: {MODEL_INFO} is unreadable: {error}") from None
    if not isinstance(info, dict) or not (folder / str(info.get("checkpoint", ""))).is_file():
        raise BadInput(f"{source}: {MODEL_INFO} names no checkpoint file of the folder")
    return info
