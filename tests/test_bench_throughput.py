"""The throughput bench's inference figures: histograms read from a run's multiprocess metrics
folder (written by other processes, as a run's children write them), and their change over the
measured window."""

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
