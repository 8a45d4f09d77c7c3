"""What every benchmark writes beside its figures: the machine, and its own docs section."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "BENCHMARKS.md"
_HEADER = ("# Benchmarks\n\nFigures come from the `bench/` commands named in each section, run on "
           "the machine each section names.\n")


def machine(versions: str) -> str:
    """CPU model, cores, kernel and Python, then ``versions`` (library versions), and the date."""
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
        if line.startswith("Model name")), platform.processor())
    return (f"{cpu}, {os.cpu_count()} cores (shared), Linux {platform.release()}; Python "
            f"{platform.python_version()}, {versions}; {time.strftime('%Y-%m-%d')}")


def write_section(section: str, text: str) -> None:
    """Replace ``section`` of docs/BENCHMARKS.md with ``text``, leaving the others as they are."""
    doc = DOCS.read_text() if DOCS.exists() else _HEADER
    head, found, tail = doc.partition(section)
    rest = tail[tail.find("\n## "):] if found and "\n## " in tail else ""
    DOCS.write_text(head.rstrip("\n") + "\n\n" + section + "\n\n" + text.strip() + "\n" + rest)
