"""``sfbus pull user/name``: a policy from the Hugging Face Hub as a run directory.

The repository (written by ``sfbus push``, :mod:`sfbus_components.commands.hub` has its layout)
is downloaded with ``huggingface_hub.snapshot_download`` and copied into ``--run-dir`` (default
``runs/hub/user/name``), which ``sfbus enjoy``, ``eval`` and ``export`` then take. They also take
``hub:user/name`` in place of a run directory, which pulls it first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sfbus_components.commands.hub import PULLED_ROOT, check_repo_id, download


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pull`` sub-command (the ``sfbus.commands`` entry point)."""
    parser = subparsers.add_parser(
        "pull", help="download a policy from the Hugging Face Hub as a run directory",
        description="Download a repository written by `sfbus push` into a run directory that "
                    "enjoy, eval and export take (they also take hub:user/name directly).")
    parser.add_argument("repo", metavar="user/name", help="the Hub repository")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="where to put it (default: runs/hub/user/name)")
    parser.set_defaults(func=cmd_pull)


def cmd_pull(args: argparse.Namespace) -> int:
    """Run ``sfbus pull``; bad input is one ``error:`` line and exit 2, a failed download 1."""
    repo = check_repo_id(args.repo, "sfbus pull")
    run_dir = download(repo, Path(args.run_dir) if args.run_dir else PULLED_ROOT / repo)
    print(f"{repo} -> {run_dir} (sfbus enjoy {run_dir})")
    return 0
