"""``sfbus sweep``: a real 2x2 grid of short runs, its comparison plot, Slurm arrays, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sfbus.cli import main

TOPOLOGY = str(Path(__file__).parents[2] / "topologies" / "cartpole.yaml")


def sfbus(*args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    """Run the command line in a process of its own, as a user does."""
    return subprocess.run([sys.executable, "-m", "sfbus", *args], capture_output=True,
                          text=True, timeout=timeout)


GRID = ("--grid", "appo.lr=1e-3,3e-4", "--grid", "model.mlp_layers=[32],[64,64]")
PRODUCT = [["appo.lr=1e-3", "model.mlp_layers=[32]"], ["appo.lr=1e-3", "model.mlp_layers=[64,64]"],
           ["appo.lr=3e-4", "model.mlp_layers=[32]"], ["appo.lr=3e-4", "model.mlp_layers=[64,64]"]]


def test_a_two_by_two_grid_is_the_product_in_order(tmp_path: Path, capsys) -> None:
    """The combinations a sweep runs, as its sweep.json lists them (written before any run
    starts; a Slurm sweep writes the same record and starts none)."""
    sweep_dir = tmp_path / "sweep"
    assert main(["sweep", TOPOLOGY, *GRID, "--set", "num_envs=4", "--sweep-dir", str(sweep_dir),
                 "--slurm", str(tmp_path / "s.sh")]) == 0, capsys.readouterr().err
    runs = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    assert [r["overrides"] for r in runs] == PRODUCT


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_sweep_runs_its_runs_side_by_side_and_plots_them(tmp_path: Path) -> None:
    """Two real runs at once, each with its combination's settings (the topology's own are lr
    1e-3 and mlp_layers [64, 64]), then one plot of both. The order of a larger grid is
    test_a_two_by_two_grid_is_the_product_in_order's, which starts no run."""
    sweep_dir = tmp_path / "sweep"
    done = sfbus("sweep", TOPOLOGY, "--grid", "appo.lr=1e-3,3e-4",
                 "--grid", "model.mlp_layers=[32]", "--set", "num_envs=4",
                 "--parallel", "2", "--max-frames", "3000", "--sweep-dir", str(sweep_dir))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    record = json.loads((sweep_dir / "sweep.json").read_text())
    runs = record["runs"]
    assert [r["overrides"] for r in runs] == [PRODUCT[0], PRODUCT[2]]
    assert [r["exit_code"] for r in runs] == [0, 0]
    for run in runs:
        run_dir = Path(run["run_dir"])
        settings = yaml.safe_load((run_dir / "topology.yaml").read_text())["settings"]
        lr, layers = (o.split("=", 1)[1] for o in run["overrides"])
        assert settings["appo"]["lr"] == float(lr)
        assert settings["model"]["mlp_layers"] == json.loads(layers)
        assert (run_dir / "progress.jsonl").read_text().strip()
        assert f"finished {run_dir.name}: exit 0" in done.stdout

    plotted = sfbus("plot", str(sweep_dir), timeout=60)
    assert plotted.returncode == 0, plotted.stderr
    assert sorted(Path(p).name for p in plotted.stdout.split()) == [
        "fps_vs_time.png", "lag_vs_frames.png", "reward_vs_frames.png", "reward_vs_time.png"]
    from sfbus_components.commands.plot import expand_sweeps, read_progress

    labels = [read_progress(run).name for run in expand_sweeps([sweep_dir])]
    assert labels == [Path(r["run_dir"]).name for r in runs]


def test_slurm_script_maps_each_task_to_its_combination(tmp_path: Path, capsys) -> None:
    script = tmp_path / "sweep.sh"
    code = main(["sweep", TOPOLOGY, "--grid", "appo.lr=1e-4,3e-4", "--grid", "seed=0,1,2",
                 "--set", "num_envs=4", "--parallel", "3", "--max-frames", "1000",
                 "--sweep-dir", str(tmp_path / "sweep"), "--slurm", str(script)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"{script}: Slurm array of 6 runs" in out
    text = script.read_text()
    assert "#SBATCH --array=0-5%3" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # each task, run with a stand-in sfbus that prints its arguments
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sfbus").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "sfbus").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    seen = set()
    for task in range(6):
        done = subprocess.run(["bash", str(script)], env={**env, "SLURM_ARRAY_TASK_ID": str(task)},
                              capture_output=True, text=True, check=True)
        args = done.stdout.splitlines()
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        assert sets[0] == "num_envs=4"
        seen.add((sets[1], sets[2]))
        run_dir = args[args.index("--run-dir") + 1]
        assert run_dir.startswith(str(tmp_path / "sweep" / f"{task:02d}-"))
        assert args[args.index("--max-frames") + 1] == "1000"
    assert seen == {(f"appo.lr={lr}", f"seed={s}") for lr in ("1e-4", "3e-4") for s in "012"}
    missing = subprocess.run(["bash", str(script)], env={**env, "SLURM_ARRAY_TASK_ID": "6"},
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no combination 6" in missing.stderr


def test_bad_grid_is_one_error_line_and_nothing_started(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "sweep"
    cases = {
        ("--grid", "appo.lr"): "expected KEY=V1,V2",
        ("--grid", "appo.lr=1e-3,"): "an empty value",
        ("--grid", "apo.lr=1e-3"): "did you mean 'appo'",
        ("--grid", "appo.lr=1e-3,-1"):
            "sweep combination 01-appo.lr=-1: --set: settings.appo.lr: lr must be > 0.0",
        ("--grid", "seed=1", "--grid", "seed=2"): "a key is given twice",
        ("--grid", "seed=1", "--parallel", "0"): "--parallel must be >= 1",
        # validated as `sfbus run` would: buffers no /dev/shm holds (was: a run started first)
        ("--grid", "num_envs=8,1099511627776"):
            "sweep combination 01-num_envs=1099511627776: the run's shared arrays need",
        # was: the product built in memory (10**12 combinations here), then each validated
        tuple(arg for key in ("seed", "num_envs", "rollout", "batch_size", "appo.lr", "appo.gamma")
              for arg in ("--grid", f"{key}=" + ",".join(str(v) for v in range(1, 101)))):
            "--grid: 100 x 100 x 100 x 100 x 100 x 100 = 1,000,000,000,000 runs; a sweep holds "
            "at most 10,000",
    }
    for args, message in cases.items():
        code = main(["sweep", TOPOLOGY, *args, "--sweep-dir", str(sweep_dir)])
        out, err = capsys.readouterr()
        assert "started" not in out
        assert code == 2, args
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
        assert not sweep_dir.exists()



def test_bad_output_paths_and_run_flags_are_one_error_line_and_leave_nothing(
        tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    sweep_dir = tmp_path / "sweep"
    script = tmp_path / "s.sh"
    cases = {  # each was a traceback (a sweep folder left), or accepted and refused by every run
        ("--slurm", str(tmp_path)): f"--slurm {tmp_path}: is a directory",
        ("--slurm", "/proc/sfbus-test.sh"): "--slurm /proc/sfbus-test.sh: cannot write it",
        ("--slurm", str(script), "--sweep-dir", str(a_file)): f"--sweep-dir {a_file}: not a "
                                                              "directory",
        ("--slurm", str(script), "--sweep-dir", str(a_file / "x")):
            f"--sweep-dir {a_file / 'x'}: cannot make it: Not a directory",
        ("--max-seconds", "inf"): "--max-seconds must be a finite number > 0, not inf",
        ("--max-seconds", "nan"): "--max-seconds must be a finite number > 0, not nan",
    }
    for args, message in cases.items():
        if "--sweep-dir" not in args:
            args = (*args, "--sweep-dir", str(sweep_dir))
        code = main(["sweep", TOPOLOGY, "--grid", "seed=0,1", *args])
        out, err = capsys.readouterr()
        assert code == 2, args
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
        assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_slurm_sweep_records_its_runs_for_plot(tmp_path: Path, capsys) -> None:
    from sfbus_components.commands.sweep import sweep_runs

    sweep_dir = tmp_path / "sweep"
    assert main(["sweep", TOPOLOGY, "--grid", "seed=0,1", "--sweep-dir", str(sweep_dir),
                 "--slurm", str(tmp_path / "s.sh")]) == 0
    capsys.readouterr()
    # was: no sweep.json, so `sfbus plot SWEEP_DIR` could not find the array's runs
    assert [p.name for p in sweep_runs(sweep_dir)] == ["00-seed=0", "01-seed=1"]
    text = (tmp_path / "s.sh").read_text()
    assert all(str(p) in text for p in sweep_runs(sweep_dir))


def test_a_sweep_dir_with_a_newline_cannot_add_commands_to_the_slurm_script(
        tmp_path: Path, capsys) -> None:
    # was: the name ended the #SBATCH comment line; its rest ran as a command of the script
    sweep_dir = f"{tmp_path}/sw\ntouch {tmp_path}/PWNED #"
    assert main(["sweep", TOPOLOGY, "--grid", "seed=0,1", "--sweep-dir", sweep_dir,
                 "--slurm", str(tmp_path / "s.sh")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: --slurm: --sweep-dir {sweep_dir!r} holds a control character")
    assert err.count("\n") == 1 and out == ""
    assert list(tmp_path.iterdir()) == []

def _two_runs_training(sweep_dir: Path, grid: str) -> subprocess.Popen[str]:
    """A sweep of CartPole over ``grid``, two runs at a time, once both are training."""
    sweep = subprocess.Popen(
        [sys.executable, "-m", "sfbus", "sweep", TOPOLOGY, "--grid", grid,
         "--set", "num_envs=4", "--parallel", "2", "--sweep-dir", str(sweep_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while len(list(sweep_dir.glob("*/progress.jsonl"))) < 2:
        if time.monotonic() > deadline or sweep.poll() is not None:
            sweep.kill()
            raise AssertionError(sweep.communicate())
        time.sleep(0.5)
    return sweep


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_ctrl_c_stops_every_run_and_records_how_they_ended(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    sweep = _two_runs_training(sweep_dir, "seed=0,1,2")
    try:
        sweep.send_signal(signal.SIGINT)
        out, err = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 130, out + err
    runs = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    # the two running ones stopped as a Ctrl-C stops a run; the third never started
    assert [r["exit_code"] for r in runs] == [130, 130, None]
    for run in runs[:2]:
        assert list((Path(run["run_dir"]) / "checkpoints" / "policy_0").glob("checkpoint_*.pt"))


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_sigkilled_sweep_takes_its_runs_with_it(tmp_path: Path) -> None:
    """Killing the sweep leaves nothing training: each run stops (gracefully) within seconds
    (they trained on, unsupervised, until they reached their limits)."""
    from sfbus.procfs import run_children

    sweep_dir = tmp_path / "sweep"
    sweep = _two_runs_training(sweep_dir, "seed=0,1")
    try:
        run_dirs = [p.parent for p in sweep_dir.glob("*/progress.jsonl")]
        assert all(run_children(d) for d in run_dirs)
        sweep.kill()
        sweep.communicate(timeout=30)
        deadline = time.monotonic() + 30
        while any(run_children(d) for d in run_dirs):
            assert time.monotonic() < deadline, {str(d): run_children(d) for d in run_dirs}
            time.sleep(0.2)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    for run_dir in run_dirs:  # stopped as a Ctrl-C stops a run: final checkpoints written
        assert list((run_dir / "checkpoints" / "policy_0").glob("checkpoint_*.pt")), run_dir
