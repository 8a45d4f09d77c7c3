"""A long doom_basic run with periodic kills: memory, open files and ``/dev/shm`` must stay flat.

``python -m bench.soak [--minutes 30] [--kill-every 60] [--sample-every 60] [--write-docs]
[--set KEY=VALUE ...]``; not in CI, it takes the machine for the whole run. What it does and how
it judges "flat" is ``ABOUT`` below, which ``--write-docs`` puts beside the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.process import stop_gracefully
from bench.report import machine, write_section
from sfbus.procfs import run_children

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = "topologies/doom_basic.yaml"
SECTION = "## Soak: a long run with periodic kills"
ORDER = ("rollout.0", "inference", "rollout.1", "learner")
MARGIN_S = 20.0  # --max-seconds past the last sample; the supervisor's clock starts before ours
FLAT = 0.05  # the most a resource may drift over the run's length, relative to its mean
JUDGED = {"procs": "processes", "rss": "RSS", "pss": "PSS", "fds": "open fds",
          "shm_run": "run's /dev/shm", "shm_all": "all of /dev/shm (not judged)"}
ABOUT = """The run is `sfbus run %(topology)s` for %(minutes)g minutes after its first env frames,
ended by its own `--max-seconds`. Every %(kill)g s, starting %(half)g s in (with equal periods a
restart has half a period to settle before the next sample), one process gets SIGKILL, in turn
rollout.0, inference, rollout.1, learner; the supervisor restarts it. Every %(sample)g s the
bench sums, over the supervisor, its children and the VizDoom engines in each child's process
group: RSS and PSS (from `/proc/<pid>/smaps_rollup`; RSS counts shared memory once per process
that maps it, PSS once in all), open file descriptors (`/proc/<pid>/fd`) and processes; and it
reads the bytes used by the run's `sfbus-<supervisor pid>-*` segments and by all of `/dev/shm`.
**Flat** means: the least-squares slope of a resource over the second half of the run (the first
half is warm-up: buffers fill, allocators reach their working set), times the run's length, is
within ±%(flat)g%% of the resource's mean over that half. All of `/dev/shm` is shown but not
judged: other users of the machine move it too. The run must also end by itself with exit 0,
leaving no process and no segment behind."""


@dataclass
class Sample:
    """One row of the table: resources summed over the run's processes at time ``t``."""

    t: float
    procs: int
    rss: int
    pss: int
    fds: int
    shm_run: int
    shm_all: int
    frames: int
    version: int
    kills: str


def run_processes(supervisor: int, groups: set[int]) -> list[int]:
    """The supervisor, its descendants, and every process in one of ``groups`` (engines whose
    worker died included: they keep its group after being re-parented)."""
    stats: dict[int, tuple[int, int]] = {}  # pid: (ppid, process group)
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(f"/proc/{entry}/stat").read_text()
            fields = text[text.rindex(")") + 2:].split()
            stats[int(entry)] = int(fields[1]), int(fields[2])
    found = {pid for pid, (_, group) in stats.items() if group in groups}
    todo = [supervisor] if supervisor in stats else []
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += [p for p, (ppid, _) in stats.items() if ppid == pid and p not in found]
    return sorted(found)


def _memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) bytes of ``pid`` from smaps_rollup."""
    values = dict(line.split()[:2] for line in Path(f"/proc/{pid}/smaps_rollup").read_text()
                  .splitlines()[1:] if line.split()[0] in ("Rss:", "Pss:"))
    return int(values["Rss:"]) * 1024, int(values["Pss:"]) * 1024


def shm_bytes(prefix: str = "") -> int:
    """Bytes used in /dev/shm: by files named ``prefix*``, or in all when no prefix."""
    if not prefix:
        st = os.statvfs("/dev/shm")
        return (st.f_blocks - st.f_bfree) * st.f_frsize
    used = 0
    for entry in os.scandir("/dev/shm"):
        if entry.name.startswith(prefix):
            with contextlib.suppress(OSError):
                used += entry.stat().st_blocks * 512
    return used


def last_record(run_dir: Path) -> dict:
    """The last complete record of ``progress.jsonl`` ({} before the first)."""
    with contextlib.suppress(OSError), (run_dir / "progress.jsonl").open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
        lines = f.read().split(b"\n")[:-1]
        return json.loads(lines[-1]) if lines else {}
    return {}


def sample(t: float, supervisor: int, groups: set[int], run_dir: Path, kills: str) -> Sample:
    """Measure the run now."""
    procs = rss = pss = fds = 0
    for pid in run_processes(supervisor, groups):
        with contextlib.suppress(OSError, KeyError):
            r, p = _memory(pid)
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            procs, rss, pss = procs + 1, rss + r, pss + p
    record = last_record(run_dir)
    version = record.get("policies", {}).get("0", {}).get("version", 0)
    return Sample(t, procs, rss, pss, fds, shm_bytes(f"sfbus-{supervisor}-"), shm_bytes(),
                  record.get("env_frames", 0), version, kills)


def drift(samples: list[Sample], key: str, length: float) -> float | None:
    """Least-squares slope over the second half, times ``length``, relative to its mean."""
    half = [s for s in samples if s.t >= length / 2]
    if len(half) < 3:
        return None
    ts, ys = np.array([s.t for s in half]), np.array([float(getattr(s, key)) for s in half])
    slope = np.polyfit(ts, ys, 1)[0]
    return float(slope * length / ys.mean()) if ys.mean() else 0.0


HEADER = ("| t (s) | processes | RSS MiB | PSS MiB | open fds | run's shm MiB | all shm MiB | "
          "env frames | version | killed since last row |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")


def row(s: Sample) -> str:
    """One markdown row of the table."""
    mib = 2**20
    return (f"| {s.t:.0f} | {s.procs} | {s.rss / mib:,.0f} | {s.pss / mib:,.0f} | {s.fds} | "
            f"{s.shm_run / mib:,.1f} | {s.shm_all / mib:,.1f} | {s.frames:,} | {s.version} | "
            f"{s.kills} |")


def verdict(samples: list[Sample], length: float, kills: int, restarts: int, code: int | None,
            leftovers: list[int], segments: list[str]) -> tuple[str, bool]:
    """Drift of each resource, restarts, how the run ended and what it left behind; and whether
    all is well (all of /dev/shm, which other users move too, is reported but not judged)."""
    lines, ok = [], code == 0 and not leftovers and not segments
    for key, label in JUDGED.items():
        d = drift(samples, key, length)
        if d is None:
            lines.append(f"{label}: too few samples in the second half to judge")
            continue
        flat = abs(d) <= FLAT
        ok &= flat or key == "shm_all"
        lines.append(f"{label}: {d:+.1%} over the run, " + ("flat" if flat else "**NOT flat**"))
    lines.append(f"restarts seen: {restarts} for {kills} kills")
    lines.append("the run finished by --max-seconds (exit 0)" if code == 0
                 else f"**the run did not finish cleanly** (exit {code})")
    lines.append(f"left behind after the run: {len(leftovers)} processes {leftovers}, "
                 f"{len(segments)} shared-memory segments {segments}")
    return "\n".join(f"- {line}" for line in lines), ok


def soak(args: argparse.Namespace, tmp: Path) -> tuple[list[Sample], str, bool]:
    """Run, kill and sample; return the samples, the verdict and whether all is well."""
    run_dir, log = tmp / "run", tmp / "output.txt"
    length = args.minutes * 60
    sets = [a for s in args.set for a in ("--set", s)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sfbus", "run", TOPOLOGY, "--run-dir", str(run_dir),
             "--max-seconds", str(length + MARGIN_S), *sets],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    samples: list[Sample] = []
    groups: set[int] = set()
    turn, kills, done = 0, 0, ""
    try:
        deadline = time.monotonic() + 300
        while last_record(run_dir).get("env_frames", 0) <= 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"no env frames from the run:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        t0 = time.monotonic()
        print(HEADER, flush=True)
        next_sample = 0.0
        next_kill = args.kill_every / 2 if args.kill_every > 0 else float("inf")
        while proc.poll() is None and next_sample <= length:
            groups |= set(run_children(run_dir).values())
            now = time.monotonic() - t0
            if now >= next_sample:  # before a kill due at the same time: it sees a whole run
                samples.append(sample(now, proc.pid, groups, run_dir, done.strip()))
                print(row(samples[-1]), flush=True)
                done, next_sample = "", next_sample + args.sample_every
            if now >= next_kill:
                name = ORDER[turn % len(ORDER)]
                with contextlib.suppress(KeyError, ProcessLookupError):  # restarting: skip it
                    os.kill(run_children(run_dir)[name], signal.SIGKILL)
                    done, kills = done + f" {name}@{now:.0f}", kills + 1
                turn, next_kill = turn + 1, next_kill + args.kill_every
            time.sleep(0.2)
        code = proc.wait(timeout=MARGIN_S + 120)
    finally:
        stop_gracefully(proc)
    time.sleep(1)  # let the last killed groups go
    leftovers = run_processes(-1, groups)  # the supervisor is gone; its pid may be reused
    segments = [n for n in os.listdir("/dev/shm") if n.startswith(f"sfbus-{proc.pid}-")]
    restarts = len(re.findall(r"exited with code \S+; restarting", log.read_text()))
    if code != 0:
        print(log.read_text()[-3000:], file=sys.stderr)
    return samples, *verdict(samples, length, kills, restarts, code, leftovers, segments)


def main(argv: list[str] | None = None) -> int:
    """Run the soak, print the table and verdict, optionally rewrite the docs section."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="length after first frames")
    parser.add_argument("--kill-every", type=float, default=60.0,
                        help="seconds between kills (0: none)")
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds between rows")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to sfbus run (repeatable)")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sfbus-soak-") as tmp:
        samples, summary, ok = soak(args, Path(tmp))
    text = "\n".join([HEADER, *map(row, samples)]) + f"\n\n{summary}"
    print("\n" + summary)
    if args.write_docs:
        import torch
        import vizdoom

        command = "python -m bench.soak " + " ".join(argv if argv is not None else sys.argv[1:])
        about = ABOUT % dict(topology=TOPOLOGY, minutes=args.minutes, kill=args.kill_every,
                             half=args.kill_every / 2, sample=args.sample_every,
                             flat=FLAT * 100)
        versions = f"torch {torch.__version__}, vizdoom {vizdoom.__version__}"
        write_section(SECTION, f"Command: `{command.strip()}`\n\nMachine: {machine(versions)}"
                      f"\n\n{about}\n\n{text}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
