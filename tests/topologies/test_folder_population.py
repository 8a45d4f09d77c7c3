"""A population across runs through a shared folder: two real CartPole members on one temporary
folder exchange weights; one killed with SIGKILL drops out of the other's view and its resume
brings it back. The Slurm script that starts such a population parses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sfbus.procfs import run_children
from sfbus_components.learning.checkpoint import latest_checkpoint, load_checkpoint
from sfbus_components.pbt.shared_folder import RECORD, MemberRecord
from tests.kernel.runs import wait_for
from tests.topologies.test_chaos import SMALL

ROOT = Path(__file__).parents[2]
MEMBER = ROOT / "topologies" / "cartpole_population_member.yaml"
# Decisions every 1024 frames, the worse of two copies the better, records twice a second, a
# silent member gone after 3 s; rollout workers not pinned (two runs on one machine would pin
# theirs to the same cores).
FAST = (*SMALL, "--set", "interval=1024", "--set", "replace_fraction=0.5",
        "--set", "checkpoint_every_s=1", "--set", "publish_every_s=0.5", "--set", "staleness_s=3",
        "--set", "processes.rollout.cpu_affinity=null")


def start_member(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """A member's run in a session of its own (so that all its processes can be killed at
    once, as a lost host), its output in files beside its run directory."""
    with run_dir.with_suffix(".out").open("a") as out:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "sfbus", "run", str(MEMBER), *args,
                                 *FAST], stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)


def history(run_dir: Path) -> list[dict]:
    """The member's PBT history so far."""
    path = run_dir / "pbt_history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def record(folder: Path, member: str) -> MemberRecord:
    """The member's record in the shared folder."""
    return MemberRecord.from_json((folder / member / RECORD).read_text())


def output(run_dir: Path) -> str:
    """What the member's run printed (for failure messages)."""
    return run_dir.with_suffix(".out").read_text()[-3000:]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)  # a run starts in ~5 s alone, ~45 s on a busy 2-core machine
def test_members_exchange_weights_and_a_killed_member_drops_out_and_rejoins(
        tmp_path: Path) -> None:
    folder = tmp_path / "population"  # the default: 'population' beside the run directories
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = start_member(a_dir, "--run-dir", str(a_dir))
    b = start_member(b_dir, "--run-dir", str(b_dir))
    resumed = None
    try:
        def exchanged() -> list[dict]:
            return [e for d in (a_dir, b_dir) for e in history(d) if e["event"] == "exchange_done"]

        wait_for(lambda: exchanged() and (folder / "b" / RECORD).exists(), 120,
                 "an exchange between the members")
        # the learner loaded the copy and checkpointed it: it trains it from that version on
        done = exchanged()[0]
        target = a_dir if done in history(a_dir) else b_dir
        source = "b" if target == a_dir else "a"
        (decision,) = [e for e in history(target) if e.get("exchange") == done["exchange"]
                       and e["event"] == "exchange"]
        assert decision["source"] == source
        assert all(frames <= decision["frames"] for frames, _ in decision["peers"].values())
        checkpoints = target / "checkpoints" / "policy_0"
        wait_for(lambda: load_checkpoint(latest_checkpoint(checkpoints))["min_version"] > 0, 30,
                 "a checkpoint of the copy")
        assert load_checkpoint(latest_checkpoint(checkpoints))["min_version"] >= done["version"]

        # b's host is lost: every process of its run dies, none stops gracefully (the launcher
        # frozen first: it neither restarts a child nor has them stop on its death)
        os.kill(b.pid, signal.SIGSTOP)
        for pid in run_children(b_dir).values():
            os.kill(pid, signal.SIGKILL)
        os.kill(b.pid, signal.SIGKILL)
        b.wait(timeout=30)
        wait_for(lambda: not run_children(b_dir), 30, "b's processes to end")
        killed = time.time()
        before = record(folder, "b")
        wait_for(lambda: any(e["event"] == "view" and "b" in e["left"] for e in history(a_dir)),
                 30, "b to drop out of a's view")
        left = next(e for e in history(a_dir) if e["event"] == "view" and "b" in e["left"])
        assert left["time"] >= killed + 2.0  # only once its record is older than staleness_s
        assert record(folder, "b").version == before.version  # nobody writes b's record

        # b resumes its run directory and is back in a's view
        subprocess.run([sys.executable, "-m", "sfbus", "clean"], check=True, timeout=60)
        resumed = start_member(b_dir, "--resume", str(b_dir))
        wait_for(lambda: any(e["event"] == "view" and "b" in e["joined"] and e["time"] > killed
                             for e in history(a_dir)), 120, "b to rejoin a's view")
        again = record(folder, "b")
        assert again.version > before.version and again.written > killed
        # its hyperparameters came back from its run directory: those of its last decision
        # before the kill, unless the resumed run has decided again since
        decisions = [e for e in history(b_dir) if e["event"] in ("keep", "mutation", "exchange")]
        decided = [e["hyperparams"] for e in decisions if e["time"] < killed]
        since = [e["hyperparams"] for e in decisions if e["time"] > killed]
        assert again.hyperparams in [decided[-1] if decided else before.hyperparams, *since]
        # its history goes on: saved with each record, not only at its decisions
        assert len(before.history) >= 2 and before.history[-2] in again.history
    finally:
        for run in (a, b, resumed):
            if run is not None and run.poll() is None:
                run.send_signal(signal.SIGTERM)
        for run in (a, b, resumed):
            if run is not None:
                try:
                    run.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(run.pid, signal.SIGKILL)
                    run.wait()
    assert a.returncode == 130, output(a_dir)
    assert resumed.returncode == 130, output(b_dir)
    assert " raised " not in output(a_dir) + output(b_dir)


def test_the_slurm_script_parses_and_starts_or_resumes_its_member(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "slurm_population.sh"
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --array" in script.read_text()

    def task(number: int) -> list[str]:  # the command array task ``number`` runs (echoed)
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(number), "SFBUS": "echo",
               "POPULATION_ROOT": str(tmp_path)}
        done = subprocess.run(["bash", str(script), "--max-frames", "1000"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.splitlines()[-1].split()

    common = ["--set", f"population_folder={tmp_path}/records", "--set",
              "population_member=task_3", "--set", "seed=3", "--max-frames", "1000"]
    assert task(3) == ["run", "topologies/cartpole_population_member.yaml", "--run-dir",
                       f"{tmp_path}/task_3", *common]
    (tmp_path / "task_3" / "checkpoints").mkdir(parents=True)  # the task ran before
    assert task(3) == ["run", "topologies/cartpole_population_member.yaml", "--resume",
                       f"{tmp_path}/task_3", *common]


def test_a_member_with_dd_ppo_ranks_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # each rank would decide alone and copy weights into its own learner: the ranks would part
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999"}
    done = subprocess.run([sys.executable, "-m", "sfbus", "run", str(MEMBER), "--run-dir",
                           str(tmp_path / "run"), "--max-seconds", "5"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {MEMBER}:21:7: actor 'population': a population member cannot "
                      "train with DD-PPO ranks yet (WORLD_SIZE 2): run each member on one node"]
    assert not (tmp_path / "run").exists()
