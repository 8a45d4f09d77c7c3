"""The throughput bench's inference figures: histograms read from a run's multiprocess metrics
folder (written by other processes, as a run's children write them), and their change over the
measured window."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from bench import throughput_topologies as tt

ROWS, LATENCY = tt.INFERENCE_HISTOGRAMS


def _observe(metrics_dir: Path, actor: str, rows: list[float]) -> None:
    """One process observing ``rows`` on the rows histogram, as an inference worker does."""
    code = textwrap.dedent(f"""
        from sfbus import metrics
        histogram = metrics.histogram({ROWS!r}, "rows", ("actor",)).labels({actor!r})
        for value in {rows!r}:
            histogram.observe(value)
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_histogram_totals_add_up_every_process_and_label(tmp_path: Path) -> None:
    _observe(tmp_path, "inference", [8, 16])
    _observe(tmp_path, "inference.1", [24])
    totals = tt.histogram_totals(tmp_path, tt.INFERENCE_HISTOGRAMS)
    assert totals == {ROWS: (48.0, 3.0), LATENCY: (0.0, 0.0)}


def test_measure_keeps_the_histograms_change_over_the_window() -> None:
    probes = iter([{ROWS: (100.0, 10.0)}, {ROWS: (400.0, 30.0)}])
    window = tt.measure({os.getpid(): "test"}, lambda: (0.0, 0),
                        lambda t: (t, int(1000 * t)), 0.0, 0.01, lambda: next(probes))
    assert window.extra["histograms"] == {ROWS: (300.0, 20.0)}


def test_histogram_totals_read_a_counters_total(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        from sfbus import metrics
        counter = metrics.counter("sfbus_rollout_idle_seconds_total", "idle", ("actor",))
        counter.labels("rollout").inc(1.5)
        counter.labels("rollout.1").inc(0.25)
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    idle = tt.ROLLOUT_WAITS[1]
    assert tt.histogram_totals(tmp_path, [idle]) == {idle: (1.75, 0.0)}


def test_the_progress_tail_counts_each_trained_batch_once(tmp_path: Path) -> None:
    """Records repeat the last batch's figures until the next one: one sample per version."""
    def record(t: float, version: int, pace: float, trained: int) -> str:
        figures = {"version": version, "learner_fps": pace, "trained_frames": trained}
        return json.dumps({"time": t, "env_frames": 1, "policies": {"0": figures}}) + "\n"

    path = tmp_path / "progress.jsonl"
    path.write_text(record(0.5, 1, 4000.0, 4096) + record(1.0, 1, 4000.0, 4096)
                    + record(1.5, 3, 1000.0, 12288))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tail = tt.ProgressTail(path, proc, tmp_path / "log", timeout=10)
        tail.until(lambda r: r[0] >= 1.5)
    finally:
        proc.kill()
        proc.wait()
    per_frame, trained = tt.LEARNER_TOTALS
    assert tail.learner_totals() == {per_frame: (1 / 4000 + 1 / 1000, 2.0),
                                     trained: (12288.0, 0.0)}
