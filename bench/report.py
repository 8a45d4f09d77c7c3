"""What every benchmark writes beside its figures: the machine, and its own docs section."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

# One file per topic; docs/BENCHMARKS.md, kept by hand, sums up their newest figures and links them.
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
_HEADER = ("# Benchmarks\n\nFigures come from the `bench/` commands named in each section, run on "
           "the machine each section names; [the summary](../BENCHMARKS.md) links every file.\n")


# The CPU flags that decide how fast the model's arithmetic runs (AVX2 only, AVX-512, bf16, AMX).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def machine(versions: str) -> str:
    """CPU model, its ISA flags, cores, kernel and Python, then ``versions`` (library
    versions), and the date."""
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
        if line.startswith("Model name")), platform.processor())
    flags = " ".join(f for f in ISA_FLAGS if f in cpu_flags()) or "no AVX2"
    return (f"{cpu} ({flags}), {os.cpu_count()} cores (shared), Linux {platform.release()}; "
            f"Python {platform.python_version()}, {versions}; {time.strftime('%Y-%m-%d')}")


def cpu_flags() -> set[str]:
    """The first CPU's flags in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def write_section(doc: str, section: str, text: str) -> None:
    """Replace ``section`` of docs/benchmarks/``doc`` with ``text``, leaving the others as they
    are (a section runs to the next ``## `` heading; a new one goes at the end)."""
    path = DOCS / doc
    old = path.read_text() if path.exists() else _HEADER
    head, found, tail = old.partition(section)
    rest = tail[tail.find("\n## "):] if found and "\n## " in tail else ""
    path.write_text(head.rstrip("\n") + "\n\n" + section + "\n\n" + text.strip() + "\n" + rest)
