"""``sfbus plot RUN_DIR [RUN_DIR ...]``: learning curves and throughput of runs as PNG figures.

Reads each run's ``progress.jsonl`` (one record per report of ``sfbus_components.monitoring.stats``)
and
draws every run into the same four figures, one line per run and policy:

- ``reward_vs_frames.png``: mean episode return against env frames
- ``reward_vs_time.png``: mean episode return against wall time
- ``fps_vs_time.png``: env frames per second (over the shortest window reported) against time
- ``lag_vs_frames.png``: mean policy lag of the learner's batches against env frames

A resumed run appends records whose time and frames start again from zero; they are shifted to
continue where the previous part ended. Unreadable lines (a run killed mid-write) are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sfbus import BadInput
from sfbus_components.commands.outputs import check_writable_dir

BAD_INPUT = 2
FIGURES = ("reward_vs_frames", "reward_vs_time", "fps_vs_time", "lag_vs_frames")


class PlotError(Exception):
    """Bad input to ``sfbus plot``: printed as one ``error:`` line, exit code 2."""


@dataclass
class Progress:
    """One run's progress records as columns (times and frames already made continuous)."""

    name: str
    time: list[float] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    fps: list[float | None] = field(default_factory=list)
    policies: list[dict[str, dict[str, float]]] = field(default_factory=list)
    fps_window: str = ""
    """Which of the records' frame-rate windows ``fps`` holds (the shortest, e.g. "10s")."""
    skipped: int = 0
    """Lines that were not a JSON record."""

    def series(self, policy: str, key: str, x: str) -> tuple[list[float], list[float]]:
        """(x, y) of ``key`` of ``policy`` where it was reported; ``x`` is "frames" or "time"."""
        xs = self.frames if x == "frames" else self.time
        points = [(at, record[policy][key]) for at, record in zip(xs, self.policies, strict=True)
                  if isinstance(record.get(policy, {}).get(key), int | float)]
        return [p[0] for p in points], [p[1] for p in points]

    def policy_ids(self) -> list[str]:
        """Every policy id the run reported, numerically sorted."""
        ids = {p for record in self.policies for p in record}
        return sorted(ids, key=lambda p: (len(p), p))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plot`` sub-command (the ``sfbus.commands`` entry point)."""
    parser = subparsers.add_parser(
        "plot", help="plot runs' learning curves and throughput (PNG)",
        description="Draw reward, frame rate and policy lag of one or more runs from their "
                    "progress.jsonl into PNG files, one line per run and policy.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directories, or a sweep's folder (all of its runs)")
    parser.add_argument("--out", metavar="DIR",
                        help="folder for the PNG files (default: the first RUN_DIR)")
    parser.set_defaults(func=cmd_plot)


def cmd_plot(args: argparse.Namespace) -> int:
    """Run ``sfbus plot``; bad input is one ``error:`` line on stderr and exit code 2."""
    out = Path(args.out) if args.out else Path(args.run_dirs[0])
    try:
        folders = expand_sweeps([Path(run) for run in args.run_dirs])
        runs = [read_progress(folder) for folder in folders]
        check_writable_dir(out, "--out", "the figures")
    except PlotError as error:  # one line, exit 2: printed by the CLI (a newline shows as \n)
        raise BadInput(str(error)) from None
    for run, folder in zip(runs, folders, strict=True):
        if run.skipped:
            print(f"warning: {folder}: skipped {run.skipped} unreadable line(s) of progress.jsonl",
                  file=sys.stderr)
    for path in plot_runs(runs, out):
        print(path)
    return 0


def expand_sweeps(folders: list[Path]) -> list[Path]:
    """Each folder, or the runs of a sweep's folder (``sfbus sweep``) that wrote progress."""
    from sfbus_components.commands.sweep import sweep_runs

    expanded = []
    for folder in folders:
        if not (folder / "sweep.json").is_file():
            expanded.append(folder)
            continue
        try:
            runs = sweep_runs(folder)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise PlotError(f"{folder / 'sweep.json'}: not a sweep record of `sfbus sweep` "
                            "(unreadable or damaged)") from None
        started = [run for run in runs if (run / "progress.jsonl").is_file()]
        if len(started) < len(runs):
            print(f"warning: {folder}: {len(runs) - len(started)} of the sweep's runs have no "
                  f"progress.jsonl yet", file=sys.stderr)
        if not started:
            raise PlotError(f"{folder}: none of the sweep's {len(runs)} runs has progress yet")
        expanded += started
    return expanded


def read_progress(run_dir: Path) -> Progress:
    """Read ``run_dir/progress.jsonl``; raises PlotError if the run has none."""
    path = run_dir / "progress.jsonl"
    if not path.is_file():
        what = "no such directory" if not run_dir.is_dir() else "no progress.jsonl (the stats " \
            "actor writes one record every report_every_s)"
        raise PlotError(f"{run_dir}: {what}")
    run = Progress(run_dir.resolve().name)
    time_offset = frames_offset = 0.0
    last_time = last_frames = 0.0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            at, frames = float(record["time"]), float(record["env_frames"])
            window, fps = _shortest_window(record.get("fps"))
            policies = {str(k): dict(v) for k, v in dict(record.get("policies") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            run.skipped += 1
            continue
        if at < last_time:  # the run was resumed: its stats actor started again from zero
            time_offset += last_time
            frames_offset += last_frames
        last_time, last_frames = at, frames
        run.time.append(at + time_offset)
        run.frames.append(int(frames + frames_offset))
        run.fps.append(fps)
        run.fps_window = window or run.fps_window
        run.policies.append(policies)
    return run


def plot_runs(runs: list[Progress], out: Path) -> list[Path]:
    """Write the four figures of ``runs`` into ``out``; returns their paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    scale, unit = _time_unit(max((r.time[-1] for r in runs if r.time), default=0.0))
    specs: dict[str, tuple[str, str, str, str]] = {
        # name: (policy key or "fps", x axis, y label, title)
        "reward_vs_frames": ("reward", "frames", "mean episode return", "Return"),
        "reward_vs_time": ("reward", "time", "mean episode return", "Return"),
        "fps_vs_time": ("fps", "time", "env frames per second", "Throughput"),
        "lag_vs_frames": ("lag", "frames", "mean policy lag (versions)", "Policy lag"),
    }
    written = []
    for name in FIGURES:
        key, x, ylabel, title = specs[name]
        figure = Figure(figsize=(7, 4.5), dpi=100, layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots()
        for run in runs:
            for label, xs, ys in _lines(run, key, x):
                axes.plot([v * scale for v in xs] if x == "time" else xs, ys, label=label)
        axes.set_xlabel(f"wall time ({unit})" if x == "time" else "env frames")
        windows = sorted({r.fps_window for r in runs if r.fps_window})
        if key == "fps" and windows:
            ylabel += f" (over {', '.join(windows)})"
        axes.set_ylabel(ylabel)
        axes.set_title(title)
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
        else:
            axes.text(0.5, 0.5, "no data yet", transform=axes.transAxes, ha="center")
        path = out / f"{name}.png"
        figure.savefig(path)
        written.append(path)
    return written


def _lines(run: Progress, key: str, x: str) -> list[tuple[str, list[float], list[float]]]:
    """(label, xs, ys) of each line of ``run`` for ``key`` (one per policy; fps: the run)."""
    if key == "fps":
        points = [(t, f) for t, f in zip(run.time, run.fps, strict=True) if f is not None]
        return [(run.name, [p[0] for p in points], [p[1] for p in points])] if points else []
    ids = run.policy_ids()
    lines = []
    for policy in ids:
        xs, ys = run.series(policy, key, x)
        if xs:
            lines.append((run.name if len(ids) == 1 else f"{run.name} policy {policy}", xs, ys))
    return lines


def _shortest_window(fps: Any) -> tuple[str, float | None]:
    """(window, frame rate) over the shortest window of a record's ``fps`` ({"10s": ...})."""
    if isinstance(fps, int | float):
        return "", float(fps)
    if not isinstance(fps, dict) or not fps:
        return "", None
    shortest = min(fps, key=lambda window: float(str(window).rstrip("s")))
    return str(shortest), float(fps[shortest])


def _time_unit(seconds: float) -> tuple[float, str]:
    """Scale and name of a readable time axis for a run of ``seconds``."""
    if seconds >= 3 * 3600:
        return 1 / 3600, "h"
    if seconds >= 3 * 60:
        return 1 / 60, "min"
    return 1.0, "s"
