"""The sfbus side of ``bench/throughput.py``: its topologies, running them, and the process tree.

The sampler topologies take their data-path settings (T, batch size, splits) from
``topologies/doom_basic.yaml``, so that the sampler and the full training run collect with the
same buffers, and its layout (an inference worker in each rollout process); they replace the
batcher and learner by ``bench.throughput:TrajectorySink``, which hands every finished slot
straight back. A case runs under the real ``sfbus run``; its rate is read from the stats actor's
``progress.jsonl`` over a window that starts ``warmup`` seconds after the first frames, and every
process of the run (VizDoom engines included) is sampled from ``/proc`` at the window's two ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.process import stop_gracefully

ROOT = Path(__file__).resolve().parent.parent
TRAINING = "topologies/doom_basic.yaml"
TRAINING_GPU = "topologies/doom_basic_gpu.yaml"
# Frequent reports, so that the window's ends fall within ~0.1 s of where the bench wants them.
REPORTING = {"progress_interval_s": 0.1, "report_every_s": 0.5}
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# ----- topologies ---------------------------------------------------------------------------

def resolved_actors(topology: str, sets: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """A topology file's actors by name, each with its process, as ``sfbus run`` resolves them
    (``topology`` relative to the repository; ``sets`` its ``--set`` overrides)."""
    from sfbus.validation import read_topology

    return {actor.name: (process, actor)
            for process in read_topology(str(ROOT / topology), sets).processes
            for actor in process.actors}


def affinity(workers: int) -> list[int]:
    """One core per rollout worker, wrapping around the machine's cores as sfbus does."""
    return [i % (os.cpu_count() or 1) for i in range(workers)]


def sampler_topology(env: str, workers: int, envs: int, random_actions: bool) -> str:
    """Rollout processes, each with its inference worker, and the sink: the sampler alone."""
    from sfbus.topology import load_topology
    from sfbus_components.datapath.settings import DataPathParams

    data_path = {f.name for f in dataclasses.fields(DataPathParams)}
    settings = {k: v for k, v in load_topology(str(ROOT / TRAINING)).settings.items()
                if k in data_path}
    settings.update(env=env, num_envs=envs, **REPORTING)
    doc = {
        "name": "bench-sampler",
        "settings": settings,
        "processes": {  # the layout of the training topology, the sink in the learner's place
            "rollout": {"replicas": workers, "cpu_affinity": affinity(workers), "restart": "never",
                        "actors": {"rollout": {"class":
                            "sfbus_components.sampling.rollout_worker:RolloutWorker"},
                                   "inference": {"class":
                                       "sfbus_components.sampling.inference_worker:InferenceWorker",
                                                 "params": {"random_actions": random_actions}}}},
            "sink": {"restart": "never", "actors": {
                "sink": {"class": "bench.throughput:TrajectorySink"},
                "stats": {"class": "sfbus_components.monitoring.stats:Stats"}}},
        },
        "connections": [
            {"from": "rollout.inference_requested", "to": "inference.on_inference_requested",
             "mode": "local"},
            {"from": "inference.actions_ready", "to": "rollout.on_actions_ready", "mode": "local"},
            {"from": "rollout.trajectory_ready", "to": "sink.on_trajectory_ready"},
            {"from": "sink.slots_released", "to": "rollout.on_slots_released", "mode": "any"},
            {"from": "rollout.episode_finished", "to": "stats.on_episode_finished",
             "coalesce_s": 0.1},
            {"from": "rollout.rollout_progress", "to": "stats.on_rollout_progress"},
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def training_overrides(env: str, workers: int, envs: int,
                       extra: Sequence[str] = ()) -> list[str]:
    """``--set`` arguments that give the training topology this bench's sizes, then ``extra``
    (``KEY=VALUE`` each, which win)."""
    cores = ",".join(map(str, affinity(workers)))
    sets = [f"env={env}", f"num_envs={envs}", f"processes.rollout.replicas={workers}",
            f"processes.rollout.cpu_affinity=[{cores}]"]
    sets += [f"{k}={v}" for k, v in REPORTING.items()]
    sets += extra
    return [arg for s in sets for arg in ("--set", s)]


# ----- the process tree ---------------------------------------------------------------------

@dataclass
class ProcStat:
    """One process at one instant: its group name, CPU ticks so far, resident and proportional
    memory in bytes."""

    name: str
    ticks: int
    rss: int
    pss: int


def _stat(pid: int) -> tuple[int, str, int, int]:
    """(ppid, comm, utime + stime ticks, rss bytes) of ``pid`` from ``/proc/<pid>/stat``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), comm, int(fields[11]) + int(fields[12]), int(fields[21]) * _PAGE


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


def snapshot(roots: dict[int, str]) -> dict[int, ProcStat]:
    """Every process under ``roots`` (pid -> name): a root keeps its name wherever it lies, an
    ``sfbus.child`` is named by its process, anything else by its parent's name and its command
    (``rollout.0 vizdoom``)."""
    stats: dict[int, tuple[int, str, int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):  # exited while we looked
                stats[int(entry)] = _stat(int(entry))
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, ProcStat] = {}
    todo = [(pid, name) for pid, name in roots.items() if pid in stats]
    while todo:
        pid, name = todo.pop()
        _, _, ticks, rss = stats[pid]
        out[pid] = ProcStat(name, ticks, rss, _pss(pid))
        for child in children.get(pid, ()):
            try:
                argv = _cmdline(child)
            except OSError:
                continue
            if child in roots:
                todo.append((child, roots[child]))
            elif "sfbus.child" in argv:
                todo.append((child, argv[-1]))
            else:
                todo.append((child, f"{name} {stats[child][1]}"))
    return out


def busy_ticks() -> int:
    """Ticks the machine's CPUs spent busy so far (all but idle and iowait), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(values) - values[3] - values[4]


def cpu_shares(before: dict[int, ProcStat], after: dict[int, ProcStat],
               seconds: float) -> dict[str, tuple[float, int]]:
    """Cores used by each group of processes between two snapshots, and its process count."""
    groups: dict[str, tuple[float, int]] = {}
    for pid, stat in after.items():
        start = before.get(pid)
        used = (stat.ticks - (start.ticks if start else 0)) / _TICKS / seconds
        share, count = groups.get(stat.name, (0.0, 0))
        groups[stat.name] = (share + used, count + 1)
    return groups


# ----- running a topology ---------------------------------------------------------------------

@dataclass
class Window:
    """What one measured window saw: frames, seconds, CPU by process group, memory."""

    frames: int
    seconds: float
    cpu: dict[str, tuple[float, int]]
    rss: int
    pss: int
    machine_busy: float = 0.0
    """Cores busy on the whole machine during the window, this case's processes included."""
    startup_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cores(self) -> float:
        """Cores this case's processes used."""
        return sum(share for share, _ in self.cpu.values())

    @property
    def others(self) -> float:
        """Cores used by everything else on the machine during the window (noise)."""
        return max(0.0, self.machine_busy - self.cores)

    @property
    def rate(self) -> float:
        """Env frames per second over the window."""
        return self.frames / self.seconds if self.seconds else 0.0


def measure(roots: dict[int, str], frames_now: Callable[[], tuple[float, int]],
            wait: Callable[[float], tuple[float, int]], warmup: float, seconds: float,
            probe: Callable[[], dict[str, tuple[float, float]]] | None = None) -> Window:
    """Sample the process tree around a window; ``wait(t)`` blocks until the frame clock reaches
    ``t`` and returns (clock, frames) then, ``frames_now()`` the current pair; ``probe()``'s
    (sum, count) pairs go into ``extra["histograms"]`` as their change over the window."""
    first, _ = frames_now()
    t0, frames0 = wait(first + warmup)
    snap0, busy0, wall0 = snapshot(roots), busy_ticks(), time.monotonic()
    before = probe() if probe else {}
    t1, frames1 = wait(t0 + seconds)
    snap1, busy1, wall1 = snapshot(roots), busy_ticks(), time.monotonic()
    window = Window(frames1 - frames0, t1 - t0, cpu_shares(snap0, snap1, wall1 - wall0),
                    sum(s.rss for s in snap1.values()), sum(s.pss for s in snap1.values()),
                    (busy1 - busy0) / _TICKS / (wall1 - wall0))
    if probe:
        after = probe()
        window.extra["histograms"] = {
            name: (total - before[name][0], count - before[name][1])
            for name, (total, count) in after.items()}
    return window


INFERENCE_HISTOGRAMS = ("sfbus_inference_batch_rows", "sfbus_inference_serve_latency_seconds")
"""The inference workers' rows per pass and time from a pass's first request to its actions."""
ROLLOUT_WAITS = ("sfbus_rollout_actions_wait_seconds", "sfbus_rollout_idle_seconds",
                 "sfbus_rollout_paused_seconds")
"""The rollout workers' round trips from a request to its actions (a histogram), the time none
of their splits could step and the split-seconds their splits waited for free slots
(counters)."""


def histogram_totals(metrics_dir: Path, names: Sequence[str]) -> dict[str, tuple[float, float]]:
    """(sum, count) of each histogram ``name`` in a run's multiprocess metrics folder, over
    every process and label (0, 0 for one no process has written); a counter's total, with a
    count of 0."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    totals = dict.fromkeys(names, (0.0, 0.0))
    for family in registry.collect():
        if family.name not in totals:
            continue
        total = sum(s.value for s in family.samples
                    if s.name in (family.name + "_sum", family.name + "_total"))
        count = sum(s.value for s in family.samples if s.name == family.name + "_count")
        totals[family.name] = (total, count)
    return totals


LEARNER_TOTALS = ("learner_seconds_per_frame", "learner_trained_frames")
"""What ``ProgressTail.learner_totals`` adds up: the train seconds per env frame of the batches
the records name (each record names the last one, so a sample of them) and the env frames
trained."""


class ProgressTail:
    """Tails a run's ``progress.jsonl``; fails fast when the run exits before the window ends.
    Adds up the learners' figures as it reads (``learner_totals``)."""

    def __init__(self, path: Path, proc: subprocess.Popen[bytes], log: Path,
                 timeout: float) -> None:
        self.path, self.proc, self.log = path, proc, log
        self.deadline = time.monotonic() + timeout
        self.offset = 0
        self.last: tuple[float, int] = (0.0, 0)
        self._versions: dict[str, int] = {}
        self._train = (0.0, 0.0)
        self._trained: dict[str, int] = {}

    def _learners(self, record: dict[str, Any]) -> None:
        """Count each policy's newly reported batch once (records repeat the last one)."""
        for policy, figures in record.get("policies", {}).items():
            version, pace = figures.get("version"), figures.get("learner_fps")
            if version is None or not pace or self._versions.get(policy) == version:
                continue
            self._versions[policy] = version
            self._train = (self._train[0] + 1.0 / pace, self._train[1] + 1)
            self._trained[policy] = int(figures.get("trained_frames", 0))

    def learner_totals(self) -> dict[str, tuple[float, float]]:
        """(sum, count) pairs: the sampled batches' train seconds per env frame, and the env
        frames trained so far by every policy (count 0)."""
        return {LEARNER_TOTALS[0]: self._train,
                LEARNER_TOTALS[1]: (float(sum(self._trained.values())), 0.0)}

    def _poll(self) -> bool:
        if self.proc.poll() is not None:
            raise SystemExit(f"the run exited ({self.proc.returncode}) before the window "
                             f"ended:\n{self.log.read_text()[-3000:]}")
        if time.monotonic() > self.deadline:
            raise SystemExit(f"the run made no progress in time\n{self.log.read_text()[-3000:]}")
        if not self.path.exists():
            return False
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            record = json.loads(line)
            self.last = (float(record["time"]), int(record["env_frames"]))
            self._learners(record)
        return bool(complete)

    def until(self, accept: Callable[[tuple[float, int]], bool]) -> tuple[float, int]:
        """Block until a record satisfies ``accept``; return its (time, frames)."""
        while not (self._poll() and accept(self.last)):
            # The rate comes from the records' own times, so a slower poll costs no accuracy,
            # and it leaves the measured run's cores alone.
            time.sleep(0.05)
        return self.last


def run_sfbus(args: list[str], warmup: float, seconds: float, tmp: Path,
              topology: str | None = None) -> Window:
    """``sfbus run`` with ``args`` (``topology`` text is written to ``tmp/bench.yaml`` first),
    measured over ``seconds`` after a ``warmup`` that starts with the first frames."""
    if topology is not None:
        (tmp / "bench.yaml").write_text(topology)
    log = tmp / "output.txt"
    limit = 300 + warmup + seconds
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sfbus", "run", *args, "--run-dir", str(tmp / "run"),
             "--max-seconds", str(limit)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        progress = ProgressTail(tmp / "run" / "progress.jsonl", proc, log, timeout=limit)
        first = progress.until(lambda r: r[1] > 0)
        startup = time.monotonic() - started
        window = measure({proc.pid: "supervisor"}, lambda: first,
                         lambda t: progress.until(lambda r: r[0] >= t), warmup, seconds,
                         lambda: {**histogram_totals(tmp / "run" / "metrics",
                                                     INFERENCE_HISTOGRAMS + ROLLOUT_WAITS),
                                  **progress.learner_totals()})
        window.startup_s = startup
        return window
    finally:
        stop_gracefully(proc)
