"""A real Prometheus server scrapes a running topology: the metrics endpoint works end to end.

Needs the ``prometheus`` and ``promtool`` binaries (Debian package ``prometheus``, installed by
``scripts/install-test-deps.sh``, which ``make test`` runs). Without them the tests skip, except
under ``CI=true``, where they are required and fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.kernel.runs import free_port

ROOT = Path(__file__).parents[2]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
SCRAPE_EXAMPLE = ROOT / "docs" / "prometheus.yml"
JOB = "sfbus"
# The topology's processes, each heart-beating to the supervisor that serves the one endpoint.
PROCESSES = {"rollout", "inference", "learner"}
# Counters that only appear once their event happens (a labelled child is created on first use).
EVENT_ONLY = {"sfbus_supervisor_restarts_total"}
# Generous: the run shares two cores with other test processes; polling returns early.
DEADLINE_S = 90.0

T = TypeVar("T")


def _required() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found; run scripts/install-test-deps.sh (Debian package prometheus)"
        if _required():
            pytest.fail(message + " — required under CI")
        pytest.skip(message)
    return path


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _await(what: str | Callable[[], str], probe: Callable[[], T | None], deadline: float,
           logs: Callable[[], str]) -> T:
    """Poll ``probe`` until it returns something other than None (or fail at ``deadline``)."""
    last_error = ""
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            value, last_error = None, repr(exc)
        if value is not None:
            return value
        time.sleep(0.25)
    what = what if isinstance(what, str) else what()
    pytest.fail(f"timed out waiting for {what} {last_error}\n{logs()}")


def _stop(proc: subprocess.Popen[bytes], group: bool = False) -> None:
    """Terminate a process we started, politely first (the supervisor stops its children)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait()


class PromAPI:
    """The query API of the Prometheus server under test."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of ``promql`` (raises ValueError on an API error)."""
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            body = json.loads(_get(url))
        except urllib.error.HTTPError as exc:  # 400/422 carry the error as JSON
            body = json.loads(exc.read())
        if body.get("status") != "success":
            raise ValueError(f"{promql}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def values(self, promql: str) -> list[float]:
        """The sample values of ``promql`` (empty while the series do not exist)."""
        return [float(sample["value"][1]) for sample in self.query(promql)]


@pytest.fixture
def tools() -> dict[str, str]:
    """Paths of the prometheus and promtool binaries (skip, or fail under CI, without them)."""
    return {name: _binary(name) for name in ("prometheus", "promtool")}


@pytest.fixture
def running_topology(tools: dict[str, str], tmp_path: Path
                     ) -> Iterator[tuple[int, Callable[[], str]]]:
    """A small CartPole run serving metrics; yields its metrics port and a log reader."""
    port = free_port()
    log_path = tmp_path / "sfbus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sfbus", "run", str(ROOT / "topologies" / "cartpole.yaml"),
             "--run-dir", str(tmp_path / "run"), "--metrics-port", str(port),
             # --max-seconds only stops a run the test failed to stop.
             "--max-seconds", "150", "--set", "num_envs=4"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        yield port, lambda: "sfbus run log (tail):\n" + log_path.read_text()[-3000:]
    finally:
        _stop(proc, group=True)


@pytest.fixture
def prometheus(tools: dict[str, str], tmp_path: Path,
               running_topology: tuple[int, Callable[[], str]]
               ) -> Iterator[tuple[PromAPI, Callable[[], str]]]:
    """A headless Prometheus scraping the run every second; yields its API and a log reader."""
    target, run_logs = running_topology
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: {JOB}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n")
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [tools["prometheus"], f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)

    def logs() -> str:
        return run_logs() + "\nprometheus log (tail):\n" + log_path.read_text()[-3000:]

    api = PromAPI(port)
    try:
        _await("Prometheus to be ready", lambda: _get(f"{api.base}/-/ready") or None,
               time.monotonic() + 30, logs)
        yield api, logs
    finally:
        _stop(proc)


def _dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard, its Grafana variables filled in."""
    fill = {"$__rate_interval": "1m", "$job": JOB, "$policy": ".*"}
    exprs = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"]
            for variable, value in fill.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"unfilled variable in {target['expr']!r}"
            exprs.append(expr)
    return exprs


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_prometheus_scrapes_a_running_topology(
        tools: dict[str, str], prometheus: tuple[PromAPI, Callable[[], str]],
        running_topology: tuple[int, Callable[[], str]]) -> None:
    api, logs = prometheus
    deadline = time.monotonic() + DEADLINE_S

    def once(promql: str, check: Callable[[list[float]], bool] = bool) -> list[float] | None:
        values = api.values(promql)
        return values if check(values) else None

    _await("the run to be scraped", lambda: once(f'up{{job="{JOB}"}} == 1'), deadline, logs)

    # Frames grow between two queries.
    frames = f'sfbus_runner_env_frames_total{{job="{JOB}"}}'
    first = _await("env frames", lambda: once(frames, lambda v: len(v) == 1 and v[0] > 0),
                   deadline, logs)[0]
    _await("env frames to grow", lambda: once(frames, lambda v: len(v) == 1 and v[0] > first),
           deadline, logs)

    # Per-policy series, the learner's figures and the policy-lag histogram.
    for series in ('sfbus_runner_episode_reward{policy="0"}',
                   'sfbus_runner_episode_length{policy="0"}',
                   'sfbus_runner_episodes_total{policy="0"}',
                   "sfbus_learner_policy_loss", "sfbus_learner_kl", "sfbus_learner_lr",
                   "sfbus_learner_ratio_mean", "sfbus_learner_valid_fraction",
                   "sfbus_learner_lag_p90", "sfbus_learner_learner_fps"):
        _await(series, lambda s=series: once(s), deadline, logs)
    buckets = _await("policy-lag buckets", lambda: api.query("sfbus_learner_policy_lag_bucket")
                     or None, deadline, logs)
    assert {"+Inf", "0.0"} <= {sample["metric"]["le"] for sample in buckets}
    _await("a trained trajectory's lag", lambda: once("sfbus_learner_policy_lag_count",
                                                      lambda v: bool(v) and v[0] > 0),
           deadline, logs)

    # One endpoint for the whole run: every process's heartbeat and bus counters.
    for name in ("sfbus_supervisor_heartbeat_age_seconds", "sfbus_bus_frames_sent_total"):
        _await(f"{name} of every process",
               lambda n=name: once(f"count by (process) ({n})",
                                   lambda v: len(v) >= len(PROCESSES)), deadline, logs)
        assert {s["metric"]["process"] for s in api.query(name)} >= PROCESSES

    # The dashboard's metric names exist and its queries are valid PromQL.
    exprs = _dashboard_queries()
    wanted = {re.sub(r"_(bucket|sum|count)$", "", name)
              for expr in exprs for name in re.findall(r"\bsfbus_\w+", expr)} - EVENT_ONLY

    missing = set(wanted)

    def all_present() -> bool | None:
        found = api.query(f'count by (__name__) ({{job="{JOB}", __name__=~"sfbus_.+"}})')
        present = {re.sub(r"_(bucket|sum|count)$", "", s["metric"]["__name__"]) for s in found}
        missing.clear()
        missing.update(wanted - present)
        return not missing or None

    _await(lambda: f"the dashboard's metrics {sorted(missing)}", all_present, deadline, logs)
    for expr in exprs:
        api.query(expr)  # raises on invalid PromQL

    # promtool lints the endpoint's exposition (it passes an empty input, so check it is full).
    target, _ = running_topology
    exposition = _get(f"http://127.0.0.1:{target}/metrics")
    assert b"sfbus_learner_policy_lag_bucket" in exposition
    lint = subprocess.run([tools["promtool"], "check", "metrics"], input=exposition,
                          capture_output=True, timeout=30)
    assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()
    assert not (lint.stdout + lint.stderr).strip(), (lint.stdout + lint.stderr).decode()


def test_scrape_config_example_is_valid() -> None:
    check = subprocess.run([_binary("promtool"), "check", "config", str(SCRAPE_EXAMPLE)],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert panel["targets"], panel["title"]
