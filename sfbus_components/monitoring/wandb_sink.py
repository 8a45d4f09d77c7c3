"""Weights & Biases logging: the TensorBoard writer's scalars and the run's settings.

Off unless a topology sets ``wandb.project`` (``--set wandb.project=NAME``); the ``wandb``
package is needed only then (``pip install wandb``), and a run asking for it without the package
is refused at validation. ``wandb.mode: offline`` writes the run under ``<run_dir>/wandb`` for a
later ``wandb sync``; ``online`` streams it.

Every scalar keeps the TensorBoard tag and is plotted against env frames: the writer's steps are
env frames, and W&B's own step must only grow, while the learner's figures and the episode means
come at frame counts that interleave; so each record carries its frames as ``env_frames``, the
x axis of every metric (``define_metric("*", step_metric="env_frames")``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class WandbConfig:
    """Where a run logs in Weights & Biases (``settings: wandb: {project: ...}``)."""

    project: str = ""
    """W&B project; empty: no logging to W&B."""
    entity: str = ""
    """Team or user owning the project; empty: the account's default."""
    group: str = ""
    """Groups runs in the W&B UI (e.g. one sweep)."""
    name: str = ""
    """Run name; empty: the run directory's name."""
    mode: Literal["online", "offline"] = "online"
    """``offline`` writes ``<run_dir>/wandb`` only (upload later with ``wandb sync``)."""
    tags: tuple[str, ...] = ()
    """Tags of the run."""

    def __post_init__(self) -> None:
        if self.project and importlib.util.find_spec("wandb") is None:
            raise ValueError("wandb.project is set but the wandb package is not installed "
                             "(pip install wandb)")
        if self.project and self.mode == "online" and not has_wandb_login():
            # else every start of the learner's process fails in wandb.init and the run ends
            # after max_restarts, its cause only in the logs
            raise ValueError("wandb.mode online needs a W&B login (`wandb login`, or "
                             "WANDB_API_KEY in the environment); or log with wandb.mode=offline "
                             "and `wandb sync` later")


def has_wandb_login() -> bool:
    """Whether ``wandb.init`` will find credentials: the environment, or ``.netrc`` for the
    W&B host. If wandb's way to read them cannot be used, assume it can (wandb then says)."""
    import os

    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:
        from wandb.sdk.lib.wbauth import read_netrc_auth

        host = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
        return read_netrc_auth(host=host) is not None
    except Exception:  # another wandb version, or a malformed key: wandb.init reports it
        return True


class WandbSink:
    """A W&B run taking the TensorBoard writer's ``add_scalar`` calls."""

    def __init__(self, config: WandbConfig, run_dir: Path, settings: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(
            project=config.project, entity=config.entity or None, group=config.group or None,
            name=config.name or run_dir.name, tags=list(config.tags), mode=config.mode,
            dir=str(run_dir), config=settings,
            # no console capture: the run's own logs already go to run_dir/logs
            settings=wandb.Settings(console="off"))
        self.run.define_metric("env_frames")
        self.run.define_metric("*", step_metric="env_frames")
        self._pending: dict[int, dict[str, float]] = {}

    def add_scalar(self, tag: str, value: float, env_frames: int) -> None:
        """Queue one scalar at ``env_frames``; sent with the others at the next flush."""
        self._pending.setdefault(int(env_frames), {})[tag] = float(value)

    def flush(self) -> None:
        """Send the queued scalars, one record per frame count."""
        for frames, values in sorted(self._pending.items()):
            self.run.log({"env_frames": frames, **values})
        self._pending.clear()

    def close(self) -> None:
        """Send what is queued and finish the W&B run (offline: its files are complete)."""
        self.flush()
        self.run.finish()
