"""The command line: validate, graph, clean, and one-line errors with exit code 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sfbus.cli import main

SUM_DEMO = str(Path(__file__).parents[2] / "topologies" / "sum_demo.yaml")


def test_validate_summarises(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", SUM_DEMO]) == 0
    assert capsys.readouterr().out == f"{SUM_DEMO}: ok (2 processes, 2 actors, 2 connections)\n"


@pytest.mark.parametrize("fmt, needle", [("mermaid", "flowchart LR"), ("dot", "digraph")])
def test_graph_formats(fmt: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", SUM_DEMO, "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert needle in out and "item_ready" in out and "on_item_consumed" in out


def test_bad_set_value_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", SUM_DEMO, "--set", "count=many"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: --set: settings.count: expected int, got str 'many'")


def test_missing_file_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "nowhere.yaml"]) == 2
    assert capsys.readouterr().err == "error: nowhere.yaml: file not found\n"


def test_resume_of_a_non_run_directory_is_exit_2(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", SUM_DEMO, "--resume", str(tmp_path)]) == 2
    assert "not a run directory (no run.json)" in capsys.readouterr().err


def test_clean_reports_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clean"]) == 0
    assert capsys.readouterr().out.endswith("stale segment(s) removed\n")


def test_impossible_sizes_are_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    topologies = Path(__file__).parents[2] / "topologies"
    base = (topologies / "appo_local_inference.yaml").read_text().splitlines()
    line = next(n for n, text in enumerate(base, 1) if text.strip().startswith("rollout: {class"))
    assert main(["validate", str(topologies / "doom_basic_sync.yaml"), "--set", "num_envs=6"]) == 2
    assert capsys.readouterr().err == (
        f"error: {topologies / 'appo_local_inference.yaml'}:{line}:7: actor 'rollout': "
        "sync mode: batch_size 1024 "
        "must be a multiple of rollout x agents = 32 x 12 (every agent of every worker "
        "contributes the same number of trajectories)\n")


CARTPOLE = str(Path(__file__).parents[2] / "topologies" / "cartpole.yaml")


@pytest.mark.parametrize(("override", "message"), [
    ("num_splits=0", "error: --set: settings.num_splits: num_splits must be >= 1, got 0"),
    ("rollout=0", "error: --set: settings.rollout: rollout must be >= 1, got 0"),
    ("num_env=32", "error: --set: settings.num_env: unknown setting 'num_env': no actor of this "
                   "topology has such a parameter; did you mean 'num_envs'?"),
])
def test_bad_settings_are_one_located_line(override: str, message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", CARTPOLE, "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--metrics-port", "70000"],
     "argument --metrics-port: 70000 is not a TCP port (0..65535; 0 = off)"),
    (["--metrics-port", "-1"], "argument --metrics-port: -1 is not a TCP port (0..65535; 0 = off)"),
    (["--max-seconds", "nan"], "argument --max-seconds: must be a finite number > 0, got nan"),
    (["--max-frames", "0"], "argument --max-frames: must be a finite number > 0, got 0"),
])
def test_bad_run_flags_are_exit_2_before_anything_starts(
        args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", SUM_DEMO, "--run-dir", str(tmp_path / "run"), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: sfbus run: {message} (see sfbus run --help)\n"
    assert not (tmp_path / "run").exists()


def test_a_metrics_port_in_use_is_exit_2_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["run", SUM_DEMO, "--run-dir", str(tmp_path / "run"),
                     "--metrics-port", str(port)]) == 2
    assert capsys.readouterr().err == (
        f"error: --metrics-port {port}: cannot serve on 127.0.0.1:{port}: Address already in use\n")
    assert not (tmp_path / "run").exists()


def test_a_run_dir_that_cannot_be_made_is_exit_2(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "hostname"
    a_file.write_text("x")
    assert main(["run", SUM_DEMO, "--run-dir", str(a_file / "x")]) == 2
    assert capsys.readouterr().err == (
        f"error: cannot create the run directory {a_file / 'x'}: Not a directory\n")


def test_a_non_empty_directory_that_holds_no_run_is_left_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "sock").mkdir()
    (tmp_path / "sock" / "keep").write_text("mine")
    (tmp_path / "notes.txt").write_text("mine")
    tmp_path.chmod(0o755)
    assert main(["run", SUM_DEMO, "--run-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: --run-dir {tmp_path}: the directory is not empty and holds no run; choose a new "
        "or empty directory\n")
    assert (tmp_path / "sock" / "keep").read_text() == "mine"
    assert tmp_path.stat().st_mode & 0o777 == 0o755


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path: Path) -> None:
    from sfbus.rundir import new_run_dir

    made = [new_run_dir("demo", tmp_path) for _ in range(3)]
    assert len(set(made)) == 3 and all(p.is_dir() for p in made)
    assert made[1].name == f"{made[0].name}-2"


def test_a_run_directory_in_use_is_refused_naming_its_pid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    from sfbus.rundir import check_run_dir

    run_dir = tmp_path / "run"
    check_run_dir(run_dir, resume=False)
    (run_dir / "run.json").write_text("{}")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, pathlib; from sfbus.rundir import RunDirLock; "
         f"RunDirLock(pathlib.Path({str(run_dir)!r})); print('held', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert main(["run", SUM_DEMO, "--resume", str(run_dir)]) == 2
        assert capsys.readouterr().err == (
            f"error: {run_dir}: in use by another run (pid {holder.pid})\n")
    finally:
        holder.communicate("", timeout=30)
    # the lock dies with its holder, whatever way it ends
    from sfbus.rundir import RunDirLock

    RunDirLock(run_dir).release()


def test_shared_arrays_no_file_can_hold_are_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cartpole = str(Path(__file__).parents[2] / "topologies" / "cartpole.yaml")
    # was: ok, then OverflowError at run (2**62: an int of 64 bits, refused beyond that)
    huge = ["--set", "num_envs=4611686018427387904"]
    assert main(["validate", cartpole, *huge]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: shared array 'rollout.traj.obs.obs' of shape ")
    assert "more than any file can hold" in err
    assert main(["run", cartpole, *huge, "--run-dir", str(tmp_path / "run")]) == 2
    assert "more than any file can hold" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_shared_arrays_beyond_dev_shm_are_bad_input_before_the_run_dir_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cartpole = str(Path(__file__).parents[2] / "topologies" / "cartpole.yaml")
    # 2**40 envs: fits a file, not this machine's /dev/shm (was: exit 1 and a run dir left)
    assert main(["run", cartpole, "--set", "num_envs=1099511627776",
                 "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: the run's shared arrays need ")
    assert "/dev/shm has " in err and "'rollout.traj.obs.obs'" in err
    assert not (tmp_path / "run").exists()


def test_resume_with_another_topology_is_refused_and_the_run_left_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    snapshot = (Path(SUM_DEMO).read_text().replace("name: sum_demo", "name: other_demo"))
    assert "name: other_demo" in snapshot
    (run_dir / "topology.yaml").write_text(snapshot)
    before = sorted(p.name for p in run_dir.iterdir())
    assert main(["run", SUM_DEMO, "--resume", str(run_dir)]) == 2
    assert capsys.readouterr().err == (
        f"error: --resume {run_dir}: that directory holds a run of topology 'other_demo', not "
        "'sum_demo'; resume it without a file, or with its own\n")
    # the same files (a run directory's lock file aside, which every run has)
    assert sorted(p.name for p in run_dir.iterdir() if p.name != "lock") == before
    assert (run_dir / "topology.yaml").read_text() == snapshot


def test_resume_and_another_run_dir_together_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "x"
    # was: --run-dir silently ignored
    assert main(["run", SUM_DEMO, "--resume", str(tmp_path), "--run-dir", str(other)]) == 2
    assert capsys.readouterr().err == (
        f"error: --resume {tmp_path} --run-dir {other}: a resumed run stays in its own "
        "directory; give one of them\n")
    assert not other.exists()
    # the same directory twice is what was meant: on to the next check
    assert main(["run", SUM_DEMO, "--resume", str(tmp_path), "--run-dir", f"{tmp_path}/."]) == 2
    assert "not a run directory (no run.json)" in capsys.readouterr().err


def test_a_value_nested_too_deeply_is_one_line_not_a_recursion_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = "[" * 20000 + "]" * 20000
    nested = tmp_path / "nested.yaml"
    nested.write_text(f"name: nested\nsettings: {{count: {deep}}}\n")
    for argv in (["validate", str(nested)], ["validate", SUM_DEMO, "--set", f"count={deep}"],
                 ["sweep", SUM_DEMO, "--grid", f"count=1,{deep}", "--slurm",
                  str(tmp_path / "s.sh"), "--sweep-dir", str(tmp_path / "sweep")]):
        assert main(argv) == 2, argv[:2]  # was: a RecursionError traceback, exit 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is nested too deeply to read" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nested.yaml"]


def test_an_app_dir_that_is_not_a_directory_is_refused(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for app_dir in (str(tmp_path / "missing"), str(a_file)):
        with pytest.raises(SystemExit) as exit_info:  # was: accepted, put on the import path
            main(["--app-dir", app_dir, "validate", SUM_DEMO])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == (
            f"error: sfbus: argument --app-dir: {app_dir}: no such directory "
            "(see sfbus --help)\n")


@pytest.mark.parametrize("command", [["eval"], ["enjoy"], ["export", "--onnx", "x.onnx"],
                                     ["plot"]])
def test_a_tools_error_naming_a_path_with_a_newline_stays_one_line(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = str(tmp_path / "no\nrun")
    assert main([command[0], odd, *command[1:]]) == 2  # was: two lines (the tools printed)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert str(tmp_path / "no\\nrun") in err


def test_a_topology_name_cannot_put_its_run_directory_outside_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    escaping = work / "escaping.yaml"
    escaping.write_text(f"name: ../../escaped\nextends: {SUM_DEMO}\n")
    assert main(["run", str(escaping)]) == 0  # was: tmp_path/escaped-<time>, beside work/
    (run_dir,) = (work / "runs").iterdir()
    assert run_dir.name.startswith("_.._escaped-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert main(["sweep", str(escaping), "--grid", "count=1,2", "--slurm",
                 str(work / "s.sh")]) == 0
    assert sorted(p.name for p in (work / "runs").iterdir())[1].startswith("sweep-.._.._escaped-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_an_empty_metrics_host_is_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # was: the probe bound every interface, then the metrics server's getaddrinfo("") raised
    # a gaierror traceback after the run directory was made
    assert main(["run", SUM_DEMO, "--set", 'run.metrics_host=""', "--metrics-port", "9",
                 "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (
        "error: --metrics-port 9: run.metrics_host is empty; name the address to serve on "
        "(127.0.0.1: this machine only, 0.0.0.0: every interface)\n")
    assert not (tmp_path / "run").exists()


def test_a_file_that_is_not_a_topology_is_refused_unread(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: opening it for reading would block
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    for path, message in (("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                          (str(tmp_path), "not a regular file"),
                          (str(big), "larger than 1 MiB")):
        assert main(["validate", path]) == 2
        assert capsys.readouterr().err == f"error: {path}: {message}" + (
            "; a topology is a few kilobytes\n" if "MiB" in message else "\n")


def test_replicas_beyond_any_machine_are_refused_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    # was: minutes spent building a million replicas' routing table before any answer
    assert main(["validate", SUM_DEMO, "--set", "processes.producer.replicas=1000000"]) == 2
    assert capsys.readouterr().err == ("error: --set: processes.producer.replicas: expected an "
                                       "int in 1..1024, got 1000000\n")


def _finished_demo_run(tmp_path: Path, *sets: str) -> Path:
    """A short real run of the kernel's demo, started with ``sets``; its directory."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    args = [a for text in sets for a in ("--set", text)]
    done = subprocess.run([sys.executable, "-m", "sfbus", "run", SUM_DEMO, "--run-dir",
                           str(run_dir), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


@pytest.mark.multiprocess
def test_resume_runs_the_runs_own_settings_and_records_what_a_set_changes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import yaml

    run_dir = _finished_demo_run(tmp_path, "count=300", "processes.producer.restart=never")

    def snapshot() -> dict:
        return yaml.safe_load((run_dir / "topology.yaml").read_text())

    assert snapshot()["settings"]["count"] == 300
    # no file: the run's own topology and settings; a --set changes only what it names
    assert main(["run", "--resume", str(run_dir), "--set", "count=400"]) == 0
    assert snapshot()["settings"]["count"] == 400
    assert snapshot()["processes"]["producer"]["restart"] == "never"  # kept as started
    # with the file, whose settings differ: said once, and the run keeps its own
    assert main(["run", SUM_DEMO, "--resume", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert (f"note: --resume {run_dir} runs the run's own topology and settings; {SUM_DEMO} "
            "differs at processes.producer.restart, settings.count and is not used") in err
    assert snapshot()["settings"]["count"] == 400
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [(h["event"], h["set"]) for h in history] == [
        ("start", ["count=300", "processes.producer.restart=never"]),
        ("resume", ["count=400"]), ("resume", [])]


@pytest.mark.multiprocess
def test_a_new_run_in_an_existing_runs_directory_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _finished_demo_run(tmp_path, "count=300")
    before = (run_dir / "topology.yaml").read_text()
    assert main(["run", SUM_DEMO, "--run-dir", str(run_dir)]) == 2  # it replaced the snapshot
    assert capsys.readouterr().err == (
        f"error: --run-dir {run_dir}: holds a run already; continue it with --resume {run_dir}, "
        "or choose a new directory\n")
    assert (run_dir / "topology.yaml").read_text() == before


def test_run_without_a_topology_or_resume_is_one_error_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 2
    assert capsys.readouterr().err == (
        "error: sfbus run: give a topology file, or --resume RUN_DIR\n")


def test_a_default_runs_folder_that_cannot_be_made_is_one_error_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir("/proc")  # no new folder can be made there, not even by root
    root = str(Path(SUM_DEMO).parents[1])
    assert main(["--app-dir", root, "run", SUM_DEMO]) == 2  # was an OSError traceback
    assert capsys.readouterr().err == (
        "error: cannot create runs/ for the run directory: No such file or directory; "
        "give --run-dir DIR\n")


@pytest.mark.multiprocess
def test_a_topology_name_too_long_for_a_file_name_still_gets_its_run_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topology = tmp_path / "long.yaml"
    topology.write_text(Path(SUM_DEMO).read_text().replace("name: sum_demo", f"name: {'x' * 300}"))
    monkeypatch.chdir(tmp_path)
    root = str(Path(SUM_DEMO).parents[1])
    assert main(["--app-dir", root, "run", str(topology)]) == 0  # was ENAMETOOLONG, exit 1
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("x" * 200 + "-") and len(run_dir.name.encode()) < 255


def test_a_kernel_command_loads_no_extension_and_help_loads_them_all() -> None:
    """`sfbus validate` of a kernel topology starts without torch (the extensions import it:
    seconds per start); the commands' names still all appear in the help and the usage error."""
    import subprocess
    import sys

    probe = ("import sys; from sfbus.cli import main; code = main(sys.argv[1:]); "
             "print('torch loaded' if 'torch' in sys.modules else 'no torch'); sys.exit(code)")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", probe, *args], capture_output=True,
                              text=True, timeout=120)

    kernel = cli("-v", "validate", SUM_DEMO)
    assert kernel.returncode == 0 and "no torch" in kernel.stdout, kernel.stderr[-2000:]
    assert cli("export", "--help").returncode == 0  # an extension still runs by its name
    for listing in (cli("--help"), cli("no-such-command")):
        for name in ("enjoy", "export", "plot", "eval", "sweep", "push", "pull", "import-sf"):
            assert name in listing.stdout + listing.stderr, listing.stderr[-2000:]
