"""A long doom_basic run with periodic kills: memory (in all and by process), open files and
``/dev/shm`` must stay flat.

``python -m bench.soak [--minutes 30] [--kill-every 60] [--sample-every 2] [--row-every 60]
[--write-docs] [--set KEY=VALUE ...]``; not in CI, it takes the machine for the whole run. By
default it samples every 2 s, prints a row every 60 s with the median RSS of the samples since
the previous row, and judges "flat" by a least-squares fit to all samples of the run's second half,
with a 95% interval; ``ABOUT`` below, which ``--write-docs`` puts beside the figures, says exactly
how.
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
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bench.process import stop_gracefully
from bench.report import machine, write_section
from sfbus.procfs import run_children

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = "topologies/doom_basic.yaml"
DOC = "soaks.md"
SECTION = "## Soak: a long run with periodic kills"
ORDER = ("rollout.0", "learner", "rollout.1")  # doom_basic's processes (inference is in rollout)
MARGIN_S = 20.0  # --max-seconds past the last sample; the supervisor's clock starts before ours
FLAT = 0.05  # the most a resource may drift over the run's length, relative to its mean
Z95 = 1.96  # standard errors in half of a 95% interval (normal approximation)
JUDGED = {"procs": "processes", "rss": "RSS", "pss": "PSS", "fds": "open fds",
          "shm_run": "run's /dev/shm", "shm_all": "all of /dev/shm (not judged)"}
ABOUT = """The run is `sfbus run %(topology)s` for %(minutes)g minutes after its first env frames,
ended by its own `--max-seconds`. Every %(kill)g s, starting %(half)g s in, one process gets
SIGKILL, in turn rollout.0 (with its inference worker), learner, rollout.1; the supervisor
restarts it. Every
%(sample)g s (just before any kill due at the same time), the bench sums, over the
supervisor, its children and the VizDoom engines in each child's process group: RSS and PSS
(from `/proc/<pid>/smaps_rollup`; RSS counts shared memory once per process that maps it, PSS
once in all), open file descriptors (`/proc/<pid>/fd`) and processes; and it reads the bytes used
by the run's `sfbus-<supervisor pid>-*` segments and by all of `/dev/shm`. It also splits the RSS
by role: `supervisor`, each child under its process name (whichever incarnation is alive; blank
while none is), and `engines`, all the other processes (VizDoom's engines, a killed worker's
included until they exit). The table has a row every %(row)g s: RSS in MiB in all and then by
role, each the median of the samples taken since the previous row (the learner's RSS swings by
±150 MiB with its batch buffers, and a restart dips a sample; a median is robust to both; a role
counts only in the samples where it is alive); the other columns are the values at the row's
time; PSS is left out. **Drift** is the least-squares slope of a resource (each total, and each
role's RSS) fitted to all the samples of the second half of the run (the first half is warm-up:
buffers fill, allocators reach their working set), not to the rows, times the run's length, over
the resource's mean in that half; it is given ± half its 95%% interval, %(z)g standard errors of
the slope, scaled the same way. A resource is **flat** when its drift is within ±%(flat)g%%;
otherwise it is **NOT flat**, a failure when the whole 95%% interval lies outside ±%(flat)g%%, and
"(within noise)", not a failure, when the interval reaches into ±%(flat)g%%. Processes and open
fds, which dip while a killed process restarts, are judged the same way. All of `/dev/shm` is
shown but not judged: other users of the machine move it too. The run must also end by itself
with exit 0, leaving no process and no segment behind."""


@dataclass
class Sample:
    """One sample: resources summed over the run's processes at time ``t``."""

    t: float
    procs: int
    rss: int
    pss: int
    roles: dict[str, int]  # RSS by role ("supervisor", a child's name, "engines"); absent: none
    fds: int
    shm_run: int
    shm_all: int
    frames: int
    version: int
    kills: str  # the processes killed since the previous sample, as "name@t ..."


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


def sample(t: float, supervisor: int, children: dict[str, int], groups: set[int], run_dir: Path,
           kills: str) -> Sample:
    """Measure the run now; ``children`` is ``run_children(run_dir)``."""
    names = {pid: name for name, pid in children.items()} | {supervisor: "supervisor"}
    procs = rss = pss = fds = 0
    by_role: dict[str, int] = {}
    for pid in run_processes(supervisor, groups):
        with contextlib.suppress(OSError, KeyError):
            r, p = _memory(pid)
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            procs, rss, pss = procs + 1, rss + r, pss + p
            role = names.get(pid, "engines")
            by_role[role] = by_role.get(role, 0) + r
    record = last_record(run_dir)
    version = record.get("policies", {}).get("0", {}).get("version", 0)
    return Sample(t, procs, rss, pss, by_role, fds, shm_bytes(f"sfbus-{supervisor}-"), shm_bytes(),
                  record.get("env_frames", 0), version, kills)


def roles(samples: list[Sample]) -> list[str]:
    """The roles seen in ``samples``: the supervisor, the children by name, the engines."""
    children = {name for s in samples for name in s.roles} - {"supervisor", "engines"}
    return ["supervisor", *sorted(children), "engines"]


def median_row(window: list[Sample]) -> Sample:
    """A row of the table: the last of ``window`` with each RSS and PSS the median over it."""
    def median(values: list[int]) -> int:
        return int(np.median(values))

    present = {name for s in window for name in s.roles}
    return replace(
        window[-1], rss=median([s.rss for s in window]), pss=median([s.pss for s in window]),
        # over the samples where the role is alive: a restarting one is not using 0 bytes
        roles={n: median([s.roles[n] for s in window if n in s.roles]) for n in present},
        kills=" ".join(s.kills for s in window if s.kills))


def drift(points: list[tuple[float, float]], length: float) -> tuple[float, float] | None:
    """Least-squares slope of ``points`` (t, value) over the second half, and its standard
    error, both times ``length`` and relative to the values' mean there."""
    half = np.array([p for p in points if p[0] >= length / 2], dtype=float)
    if len(half) < 3:  # a line through two points has no residual to estimate the error from
        return None
    t, v = half[:, 0], half[:, 1]
    slope, intercept = np.polyfit(t, v, 1)
    residual = v - (slope * t + intercept)
    error = np.sqrt((residual @ residual) / (len(half) - 2) / ((t - t.mean()) ** 2).sum())
    mean = v.mean()
    return (float(slope * length / mean), float(error * length / mean)) if mean else (0.0, 0.0)


def header(names: list[str]) -> str:
    """The table's markdown header, with an RSS column for each role in ``names``."""
    return ("| t (s) | processes | RSS MiB, all | " + "".join(f"{n} | " for n in names)
            + "open fds | run's shm MiB | all shm MiB | env frames | version | "
            "killed since last row |\n" + "| ---: " * (len(names) + 8) + "| --- |")


def row(s: Sample, names: list[str]) -> str:
    """One markdown row of the table, with the RSS of each role in ``names`` (blank: none)."""
    mib = 2**20
    by_role = "".join(f"{s.roles[n] / mib:,.0f} | " if n in s.roles else " | " for n in names)
    return (f"| {s.t:.0f} | {s.procs} | {s.rss / mib:,.0f} | {by_role}{s.fds} | "
            f"{s.shm_run / mib:,.1f} | {s.shm_all / mib:,.1f} | {s.frames:,} | {s.version} | "
            f"{s.kills} |")


def verdict(samples: list[Sample], length: float, kills: int, restarts: int, code: int | None,
            leftovers: list[int], segments: list[str]) -> tuple[str, bool]:
    """Drift of each resource and of each role's RSS, restarts, how the run ended and what it left
    behind; and whether all is well (all of /dev/shm, which other users move too, is reported but
    not judged)."""
    lines, ok = [], code == 0 and not leftovers and not segments
    series = [(label, [(s.t, getattr(s, key)) for s in samples], key != "shm_all")
              for key, label in JUDGED.items()]
    series += [(f"RSS of {name}", [(s.t, s.roles[name]) for s in samples if name in s.roles], True)
               for name in roles(samples)]
    for label, points, judged in series:
        fit = drift(points, length)
        if fit is None:
            lines.append(f"{label}: too few samples in the second half to judge")
            continue
        d, margin = fit[0], Z95 * fit[1]
        noise = abs(d) - margin <= FLAT  # the 95% interval reaches into ±FLAT
        ok &= noise or not judged
        lines.append(f"{label}: {d:+.1%} ± {margin:.1%} (95%) over the run, "
                     + ("flat" if abs(d) <= FLAT else
                        "NOT flat (within noise)" if noise else "**NOT flat**"))
    lines.append(f"restarts seen: {restarts} for {kills} kills")
    lines.append("the run finished by --max-seconds (exit 0)" if code == 0
                 else f"**the run did not finish cleanly** (exit {code})")
    lines.append(f"left behind after the run: {len(leftovers)} processes {leftovers}, "
                 f"{len(segments)} shared-memory segments {segments}")
    return "\n".join(f"- {line}" for line in lines), ok


def soak(args: argparse.Namespace, tmp: Path) -> tuple[list[Sample], str, bool]:
    """Run, kill and sample; return the table's rows, the verdict and whether all is well."""
    run_dir, log = tmp / "run", tmp / "output.txt"
    length = args.minutes * 60
    sets = [a for s in args.set for a in ("--set", s)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sfbus", "run", TOPOLOGY, "--run-dir", str(run_dir),
             "--max-seconds", str(length + MARGIN_S), *sets],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    samples: list[Sample] = []
    rows: list[Sample] = []
    groups: set[int] = set()
    names: list[str] = []  # the table's roles, known from the first sample
    turn, kills, done = 0, 0, ""
    try:
        deadline = time.monotonic() + 300
        while last_record(run_dir).get("env_frames", 0) <= 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"no env frames from the run:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        t0 = time.monotonic()
        next_sample = next_row = 0.0
        first = 0  # the first sample of the next row
        next_kill = args.kill_every / 2 if args.kill_every > 0 else float("inf")
        while proc.poll() is None and next_sample <= length:
            children = run_children(run_dir)
            groups |= set(children.values())
            now = time.monotonic() - t0
            if now >= next_sample:  # before a kill due at the same time: it sees a whole run
                samples.append(sample(now, proc.pid, children, groups, run_dir, done.strip()))
                done, next_sample = "", next_sample + args.sample_every
                if now >= next_row or next_sample > length:  # the last sample ends a row too
                    rows.append(median_row(samples[first:]))
                    if not names:
                        names = roles(samples)
                        print(header(names), flush=True)
                    print(row(rows[-1], names), flush=True)
                    first, next_row = len(samples), next_row + args.row_every
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
    return rows, *verdict(samples, length, kills, restarts, code, leftovers, segments)


def main(argv: list[str] | None = None) -> int:
    """Run the soak, print the table and verdict, optionally rewrite the docs section."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="length after first frames")
    parser.add_argument("--kill-every", type=float, default=60.0,
                        help="seconds between kills (0: none)")
    # Every 2 s: the learner's RSS swings ~±150 MiB between samples, and the drift's interval
    # narrows with the square root of their number (±8% for the learner over 30 minutes).
    parser.add_argument("--sample-every", type=float, default=2.0,
                        help="seconds between samples")
    parser.add_argument("--row-every", type=float, default=60.0,
                        help="seconds between rows of the table (medians of the samples)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to sfbus run (repeatable)")
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite docs/benchmarks/soaks.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sfbus-soak-") as tmp:
        rows, summary, ok = soak(args, Path(tmp))
    names = roles(rows)
    text = "\n".join([header(names), *(row(r, names) for r in rows)]) + f"\n\n{summary}"
    print("\n" + summary)
    if args.write_docs:
        import torch
        import vizdoom

        command = "python -m bench.soak " + " ".join(argv if argv is not None else sys.argv[1:])
        about = ABOUT % dict(topology=TOPOLOGY, minutes=args.minutes, kill=args.kill_every,
                             half=args.kill_every / 2, sample=args.sample_every,
                             row=args.row_every, z=Z95, flat=FLAT * 100)
        versions = f"torch {torch.__version__}, vizdoom {vizdoom.__version__}"
        write_section(DOC, SECTION, f"Command: `{command.strip()}`\n\nMachine: {machine(versions)}"
                      f"\n\n{about}\n\n{text}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
