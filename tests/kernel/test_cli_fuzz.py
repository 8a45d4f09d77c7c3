"""Fuzzing the command line: random flags and ``--set`` paths and values never give a traceback.

Every input either works (exit 0) or is bad input (exit 2, one ``error:`` line); ``run`` is
fuzzed up to its checks (an invalid run is refused before anything starts, and a valid one is not
started: ``--max-frames`` is always bad there), and with numbers (NaN, infinities, huge, tiny,
negative zero, exponents) through to a launched run of the kernel's demo.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfbus.cli import main

TOPOLOGIES = Path(__file__).parents[2] / "topologies"
FILES = st.sampled_from([str(TOPOLOGIES / "cartpole.yaml"), str(TOPOLOGIES / "sum_demo.yaml")])
PARTS = st.sampled_from(["num_envs", "num_splits", "rollout", "batch_size", "seed", "appo", "lr",
                         "model", "core", "run", "heartbeat_interval_s", "processes", "rollout",
                         "replicas", "actors", "params", "learner", "settings", "name", "count",
                         "connections", "mode", "extends", "x", "", " ", "0"])
VALUES = st.sampled_from(["0", "-1", "1", "1e3", "'1e3'", "[1, 2", "[]", "{}", "null", "true",
                          ".nan", "-.inf", "99999999999999999999", "abc", "", "&a [*a]", "'",
                          "{a: 1}", "3.5"]) | st.text(max_size=12)
SETS = st.lists(st.builds(lambda path, value: f"{'.'.join(path)}={value}",
                          st.lists(PARTS, min_size=1, max_size=4), VALUES), max_size=3)
FLAGS = st.lists(st.sampled_from(["--metrics-port", "--max-seconds", "--nodes", "--node-rank",
                                  "--master", "--resume", "--format", "--bogus", "-v"])
                 | VALUES, max_size=4)
FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse's own refusal
        code = exit_info.code
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)


@FUZZ
@given(file=FILES, sets=SETS, flags=FLAGS)
def test_validate_and_graph_never_trace_back(file: str, sets: list[str], flags: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    overrides = [arg for text in sets for arg in ("--set", text)]
    _check(["validate", file, *overrides], capsys)
    _check(["graph", file, *overrides, *flags], capsys)


@FUZZ
@given(file=FILES, sets=SETS, flags=FLAGS)
def test_run_refuses_bad_input_before_starting(file: str, sets: list[str], flags: list[str],
                                               tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    overrides = [arg for text in sets for arg in ("--set", text)]
    run_dir = tmp_path / "never"
    _check(["run", file, "--run-dir", str(run_dir), *overrides, *flags, "--max-frames", "0"],
           capsys)
    assert not run_dir.exists()


@FUZZ
@given(file=FILES, sets=SETS, flags=FLAGS)
def test_run_checks_every_setting_before_it_would_start(
        file: str, sets: list[str], flags: list[str], tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture[str]) -> None:
    """As above, but with every check of ``cmd_run`` reached: the run itself is replaced by a
    stand-in, so an input that passes them all is exit 0 and nothing starts."""
    import sfbus.supervisor

    started = []

    class StandIn:
        def __init__(self, *args: object) -> None:
            pass

        async def run(self) -> int:
            started.append(True)
            return 0

    overrides = [arg for text in sets for arg in ("--set", text)]
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sfbus.supervisor, "Supervisor", StandIn)
        _check(["run", file, "--run-dir", str(run_dir), *overrides, *flags], capsys)
    assert started or not run_dir.exists()


GRID_VALUES = st.lists(VALUES.filter(lambda v: "," not in v), min_size=1, max_size=3)


@FUZZ
@given(file=FILES, grid=st.lists(st.tuples(st.lists(PARTS, min_size=1, max_size=3), GRID_VALUES),
                                 min_size=1, max_size=2), flags=FLAGS)
def test_sweep_never_traces_back_and_leaves_nothing_when_refused(
        file: str, grid: list, flags: list[str], tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path_factory.mktemp("sweep")
    grids = [arg for path, values in grid for arg in ("--grid", f"{'.'.join(path)}="
                                                                 f"{','.join(values)}")]
    argv = ["sweep", file, *grids, *flags, "--sweep-dir", str(folder / "sweep"),
            "--slurm", str(folder / "s.sh")]  # --slurm: writes a script, never runs
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert not list(folder.iterdir()), argv


def test_a_user_env_that_raises_at_validation_is_one_located_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken_env.py").write_text(
        "def make(**kwargs):\n    raise RuntimeError('my env is broken')\n")
    topology = [str(TOPOLOGIES / "cartpole.yaml"), "--set", "env=broken_env:make"]
    for command, extra in (("validate", []), ("run", ["--run-dir", str(tmp_path / "run")])):
        code = main(["--app-dir", str(tmp_path), command, *topology, *extra])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert "actor 'rollout'" in err and "RuntimeError: my env is broken" in err, err
    assert not (tmp_path / "run").exists()


NUMBERS = st.sampled_from(["0", "-0.0", "1", "2", "0.5", "1e1", "1e3", "1e-300", "1e300",
                           ".nan", "-.inf", ".inf", "9223372036854775808", "-1", "0x10", "1_0"])
RUN_KNOBS = st.sampled_from(["run.heartbeat_interval_s", "run.heartbeat_timeout_s",
                             "run.start_timeout_s", "run.stop_timeout_s",
                             "run.restart_window_s", "run.max_restarts", "count",
                             "processes.producer.actors.producer.params.slots"])


@pytest.mark.multiprocess
@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sets=st.lists(st.tuples(RUN_KNOBS, NUMBERS), min_size=1, max_size=2))
def test_numbers_that_pass_the_checks_reach_a_run_that_ends(
        sets: list[tuple[str, str]], tmp_path_factory: pytest.TempPathFactory) -> None:
    """The kernel's demo launched for real with fuzzed numbers: refused (one line, nothing
    made), or run to its end (0) or to a failure its supervision names (1); never a traceback,
    never a run that outlives its limit (a 1e-300 s heartbeat once flooded it for ever)."""
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    overrides = [arg for key, value in sets for arg in ("--set", f"{key}={value}")]
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(TOPOLOGIES / "sum_demo.yaml"), "--run-dir",
         str(run_dir), "--max-seconds", "3", *overrides],
        capture_output=True, text=True, timeout=90, cwd=TOPOLOGIES.parent)
    assert done.returncode in (0, 1, 2), (sets, done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, (sets, done.stderr[-3000:])
    if done.returncode == 2:
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
        assert not run_dir.exists()
