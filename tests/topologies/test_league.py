"""The league topologies through the real CLI: snapshots written, frozen opponents loaded into
the opponent slots and never trained, matches in the payoff table, ratings moving, all of it
kept by --resume (league_rps.yaml); VizDoom duels against snapshots (league_duel.yaml)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TOPOLOGIES = Path(__file__).parents[2] / "topologies"
LEAGUE_RPS = TOPOLOGIES / "league_rps.yaml"
LEAGUE_DUEL = TOPOLOGIES / "league_duel.yaml"


def run(*args: str, reached: Callable[[], bool], timeout: float = 90) -> str:
    """``sfbus run ARGS``, stopped gracefully (SIGINT, exit 130) once ``reached()`` holds, else
    at its own limits (exit 0); its stderr. It must end cleanly, with no contained failure."""
    with (Path(args[args.index("--run-dir") + 1] if "--run-dir" in args else args[1])
          .with_suffix(".stderr")).open("w+") as err:
        process = subprocess.Popen([sys.executable, "-m", "sfbus", "run", *args],
                                   stdout=subprocess.DEVNULL, stderr=err, text=True)
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None and time.monotonic() < deadline:
                if reached():
                    process.send_signal(signal.SIGINT)
                    break
                time.sleep(0.2)
            process.wait(timeout=max(deadline - time.monotonic(), 1))
        finally:
            process.kill()
            process.wait()
        err.seek(0)
        text = err.read()
    assert process.returncode in (0, 130), text[-3000:]
    assert " raised " not in text, text[-3000:]
    return text


def league_state(run_dir: Path) -> dict[str, Any]:
    """The league's ``state.json`` ({} before its first write)."""
    path = run_dir / "league" / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def snapshots(run_dir: Path) -> list[dict[str, Any]]:
    """The whole lines of the store's index."""
    path = run_dir / "league" / "snapshots.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def played_snapshots(run_dir: Path) -> bool:
    """Policy 0 has played matches against a snapshot, and every slot holds one."""
    state = league_state(run_dir)
    return bool(state) and None not in state["resident"] and any(
        a == "policy:0" and b.startswith("snapshot:") for a, b, *_ in state["payoff"]["table"])


def samples(run_dir: Path, part: str) -> list[Any]:
    """The samples of every metric family whose name holds ``part``, from the run's files."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(run_dir / "metrics"))
    return [sample for family in registry.collect() if part in family.name
            for sample in family.samples]


def metric_samples(run_dir: Path, part: str) -> dict[str, float]:
    """The samples of every metric family whose name holds ``part``, by their labels."""
    return {f"{sample.name}{sorted(sample.labels.items())}": sample.value
            for sample in samples(run_dir, part)}


ROLES = ("policy:0", "newest_snapshot:0", "slot:0", "slot:1")
"""The rating gauge's labels, by role: a bounded set (the store grows)."""


def rated_roles(run_dir: Path) -> set[str]:
    """The players the league's rating gauge has reported (every ``report_every_s``)."""
    return {sample.labels["player"] for sample in samples(run_dir, "sfbus_league_rating")}


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_a_league_snapshots_serves_rates_and_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run(str(LEAGUE_RPS), "--run-dir", str(run_dir), "--max-seconds", "60",
        "--set", "snapshot_every=2000", "--set", "rotate_every_s=0.5",
        "--set", "report_every_s=0.5",
        reached=lambda: len(snapshots(run_dir)) >= 3 and played_snapshots(run_dir)
        and rated_roles(run_dir) >= set(ROLES))
    first = snapshots(run_dir)
    assert len(first) >= 3 and first[0]["reason"] == "first"
    assert {s["reason"] for s in first[1:]} <= {"frames", "win_rate"}
    assert all((run_dir / "league" / s["file"]).is_file() for s in first)
    state = league_state(run_dir)
    # the slots held snapshots, and after training still hold their weights bit for bit
    assert None not in state["resident"]
    assert state["slots_intact"] and all(state["slots_intact"])
    assert state["payoff"]["matches"] > 0
    ratings = state["payoff"]["ratings"]
    assert any(abs(r - 1000.0) > 1e-6 for r in ratings.values()), ratings
    loads = metric_samples(run_dir, "league_slot_loads")
    assert sum(loads.values()) >= 2, loads  # both slots filled
    assert rated_roles(run_dir) >= set(ROLES), metric_samples(run_dir, "sfbus_league_rating")
    # no frozen opponent's trajectory reached the batcher: it saw only policy 0's
    assert sum(metric_samples(run_dir, "batcher_ignored_trajectories").values()) == 0
    assert list((run_dir / "tensorboard" / "league").glob("events.out.tfevents.*"))

    def played_on() -> bool:
        return league_state(run_dir).get("payoff", {}).get("matches", 0) \
            > state["payoff"]["matches"] + 50

    err = run("--resume", str(run_dir), "--max-seconds", "60", reached=played_on)
    assert snapshots(run_dir)[:len(first)] == first  # append-only across the resume
    again = league_state(run_dir)
    assert again["payoff"]["matches"] > state["payoff"]["matches"]
    assert set(again["payoff"]["ratings"]) >= set(ratings)
    assert f"league: resumed {state['payoff']['matches']} matches" in err, err[-3000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_best_response_trains_against_a_fixed_opponent(tmp_path: Path) -> None:
    import torch

    from sfbus import load_topology
    from sfbus_components.datapath.record import TrajectoryWriter
    from sfbus_components.datapath.settings import build_policy
    from sfbus_components.envs.matrix_game import ROCK_PAPER_SCISSORS
    from sfbus_components.league.store import SnapshotStore

    # a snapshot of a policy of the run's model that always plays rock (its actor's bias decides)
    data = load_topology(LEAGUE_RPS).actors_of(TrajectoryWriter)[0].spec.params
    rock = build_policy(data)
    with torch.no_grad():
        rock.model.actor.weight.zero_()
        rock.model.actor.bias.copy_(torch.tensor([20.0, 0.0, 0.0]))
    assert ROCK_PAPER_SCISSORS[1][0] == 1.0  # paper beats rock
    store = SnapshotStore(tmp_path / "rock")
    file = store.folder / store.add(0, 1, 0, torch.cat(
        [t.detach().reshape(-1) for t in rock.published_tensors()]), "first").file
    run_dir = tmp_path / "run"

    def beats_it() -> bool:
        state = league_state(run_dir)
        rows = [row for row in state.get("payoff", {}).get("table", ())
                if row[:2] == ["policy:0", "fixed:0"]]
        return bool(rows) and sum(rows[0][2:]) >= 300 and rows[0][2] / sum(rows[0][2:]) > 0.6

    run(str(LEAGUE_RPS), "--run-dir", str(run_dir), "--max-seconds", "60",
        "--set", f"fixed_opponents=[{file}]", "--set", "policy_mapping_params.latest_ratio=0.0",
        "--set", "report_every_s=0.5", "--set", "appo.lr=0.01", reached=beats_it)
    state = league_state(run_dir)
    assert beats_it(), state["payoff"]["table"]
    assert state["resident"] == [None, None]  # no snapshot of the store was drawn
    assert state["slots_intact"] == [True, True]  # both slots held the rock, bit for bit
    assert {row[1] for row in state["payoff"]["table"] if row[0] == "policy:0"} == {"fixed:0"}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_league_duels_play_snapshots_in_vizdoom(tmp_path: Path) -> None:
    pytest.importorskip("vizdoom")
    run_dir = tmp_path / "run"
    run(str(LEAGUE_DUEL), "--run-dir", str(run_dir), "--max-seconds", "100",
        "--set", "num_policies=2", "--set", "env_kwargs.episode_timeout=200",
        "--set", "rollout=16", "--set", "batch_size=64", "--set", "model.core_size=64",
        "--set", "rotate_every_s=1", "--set", "report_every_s=1",
        reached=lambda: played_snapshots(run_dir), timeout=140)
    assert played_snapshots(run_dir), league_state(run_dir)
    assert snapshots(run_dir)[0]["reason"] == "first"
