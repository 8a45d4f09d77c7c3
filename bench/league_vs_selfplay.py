"""A league agent against a plain self-play agent on repeated rock-paper-scissors (#38 item 1,
"show it matters").

``python -m bench.league_vs_selfplay [--frames N] [--seeds S ...] [--matches M] [--rounds R]
[--work-dir DIR] [--write-docs]``

The game is ``topologies/league_rps.yaml``'s: 8 rounds of rock-paper-scissors a match, each
agent seeing its own and its opponent's previous action (``sfbus_components.envs.matrix_game``;
``--rounds 1``: plain rock-paper-scissors, nothing to see).
Its only equilibrium is uniform play, so every other policy is exploitable, and plain self-play
is known to chase its own current strategy round the cycle instead of settling there. For each
of ``--seeds`` seeds, every run stopped at the same ``--frames`` env frames (of all agents):

1. plain self-play: ``league_rps.yaml`` with ``latest_ratio: 1.0`` (agent 1 always plays the
   current policy as well; the league actor snapshots it but no match ever meets a snapshot);
2. the league: ``league_rps.yaml`` as shipped but for faster slot rotation (``latest_ratio:
   0.25``, PFSP ``(1 - x)^2`` over all snapshots, 2 slots);
3. head to head: ``sfbus eval LEAGUE --opponent SELFPLAY_CHECKPOINT`` for every pair of seeds,
   ``--matches`` sampled matches each: the league's win rate (1 a won match, 0.5 a draw) with
   its 95 % interval; and the exact expected win rate of the same two policies;
4. exploitability: a fresh agent trained for the same frames against each final policy, frozen
   (the league with ``fixed_opponents: [CHECKPOINT]`` and ``latest_ratio: 0``), then its win
   rate and mean return against it by ``sfbus eval --opponent``; and the exact exploitability,
   from the policy's action probabilities for each of the game's 10 observations: the best
   response's expected return and win rate over a match, by dynamic programming over the
   rounds (it knows the policy and may steer what the policy sees next). Lower is better; 0
   return and 0.5 win rate at the equilibrium. The same exact figures for every snapshot the
   runs stored show how each agent's exploitability moves as it trains.

Every run is bounded by env frames, so the machine's load changes the wall time more than the
figures; it still moves them, as training is asynchronous (the policy lag, and the league
redraws its slots every 0.5 s of wall time): a seed fixes the first weights and the draws, not
the run (docs/benchmarks/league.md).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import write_section

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = "topologies/league_rps.yaml"
DOC = "league.md"
PLOT = "league_rps_{rounds}_rounds.png"  # beside DOC
SECTION = "## League vs plain self-play: rock-paper-scissors, matches of {rounds} round(s)"
COMMON = ["rotate_every_s=0.5", "report_every_s=1"]
AGENTS = {
    "self-play": ["policy_mapping_params={latest_ratio: 1.0}"],
    "league": ["policy_mapping_params={latest_ratio: 0.25}"],
}
BEST_RESPONSE = ["policy_mapping_params={latest_ratio: 0.0}"]  # + fixed_opponents=[file]
BEST_RESPONSE_SEED = 1000  # best responders' seeds: apart from the agents'


def sfbus(*args: str, log: Path) -> None:
    """``python -m sfbus ARGS`` in the repository, its output into ``log``; raises on failure."""
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "sfbus", *args], cwd=REPO, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sfbus {args[0]} failed ({done.returncode}); "
                           f"{log}:\n{log.read_text()[-3000:]}")


def train(run_dir: Path, frames: int, seed: int, sets: list[str]) -> Path:
    """One ``league_rps.yaml`` run to ``frames`` env frames; its newest checkpoint."""
    args = [a for s in [*COMMON, f"seed={seed}", *sets] for a in ("--set", s)]
    sfbus("run", TOPOLOGY, "--run-dir", str(run_dir), "--max-frames", str(frames), *args,
          log=run_dir.with_suffix(".log"))
    return max((run_dir / "checkpoints" / "policy_0").glob("checkpoint_*.pt"))


def head_to_head(run_dir: Path, opponent: Path, matches: int, seed: int,
                 out: Path) -> np.ndarray:
    """``sfbus eval RUN --opponent FILE``: the wins (1, 0.5, 0) and returns of its matches."""
    sfbus("eval", str(run_dir), "--opponent", str(opponent), "--episodes", str(matches),
          "--envs", "16", "--seed", str(seed), "--out", str(out), log=out.with_suffix(".log"))
    with (out / "eval_policy_0.csv").open() as file:
        rows = [r for r in csv.DictReader(file) if r["seed"] != "mean"]
    return np.array([[float(r["win"]), float(r["return"])] for r in rows])


def interval(values: np.ndarray) -> tuple[float, float]:
    """The mean and the half width of its 95 % interval (normal approximation)."""
    return float(values.mean()), float(1.96 * values.std(ddof=1) / math.sqrt(len(values)))


# --- exact figures, from a policy's action probabilities for each observation --------------

def payoff_matrix() -> np.ndarray:
    """league_rps.yaml's game: rock-paper-scissors, the row player's payoff."""
    from sfbus_components.envs.matrix_game import ROCK_PAPER_SCISSORS

    return np.array(ROCK_PAPER_SCISSORS)


def action_table(run_dir: Path, weights: Path) -> np.ndarray:
    """``[1 + n * n, n]``: the policy's action probabilities in the first round (row 0) and
    after each (own, other) pair of previous actions (row ``1 + n * own + other``); ``weights``
    a checkpoint or a league snapshot of the run's model."""
    import torch

    from sfbus_components.commands.enjoy import learners
    from sfbus_components.envs import env_spec
    from sfbus_components.league.store import load_opponent
    from sfbus_components.models.policy import Policy

    data = learners(run_dir)[0].data
    spec = env_spec(data.env, **data.env_kwargs)
    policy = Policy(spec, data.model)
    load_opponent(weights, policy)
    policy = policy.prepare_for_inference()
    n = spec.action_heads[0]
    obs = np.zeros((1 + n * n, 2 * n), np.float32)
    for own in range(n):
        for other in range(n):
            obs[1 + n * own + other, [own, n + other]] = 1.0
    out = policy.step({"obs": torch.from_numpy(obs)}, torch.zeros(len(obs), data.state_size))
    return torch.softmax(out.action_logits[:, :n].float(), dim=1).numpy().astype(np.float64)


def seen(own: int | None, other: int | None, n: int) -> int:
    """The row of an action table an agent reads, from its own and the other's last action."""
    return 0 if own is None else 1 + n * own + other


def best_response(table: np.ndarray, payoff: np.ndarray, rounds: int) -> tuple[float, float]:
    """The exact best response to ``table`` over a match: its highest expected return, and its
    highest win rate (a draw half a win), each maximized on its own."""
    n = len(payoff)

    @functools.cache
    def value(t: int, mine: int | None, theirs: int | None, lead: float) -> tuple[float, float]:
        if t == rounds:
            return 0.0, (1.0 if lead > 0 else 0.5 if lead == 0 else 0.0)
        p = table[seen(theirs, mine, n)]
        best_return = best_win = -math.inf
        for b in range(n):
            ret = win = 0.0
            for a in range(n):
                gain = payoff[b, a]
                later = value(t + 1, b, a, lead + gain - payoff[a, b])
                ret += p[a] * (gain + later[0])
                win += p[a] * later[1]
            best_return, best_win = max(best_return, ret), max(best_win, win)
        return best_return, best_win

    return value(0, None, None, 0.0)


def expected_match(first: np.ndarray, second: np.ndarray, payoff: np.ndarray,
                   rounds: int) -> tuple[float, float]:
    """``first``'s exact expected return and win rate against ``second`` over a match."""
    n = len(payoff)
    states: dict[tuple[int | None, int | None, float], float] = {(None, None, 0.0): 1.0}
    expected = 0.0
    for _ in range(rounds):
        following: dict[tuple[int | None, int | None, float], float] = {}
        for (a_last, b_last, lead), chance in states.items():
            pa, pb = first[seen(a_last, b_last, n)], second[seen(b_last, a_last, n)]
            for a in range(n):
                for b in range(n):
                    q = chance * pa[a] * pb[b]
                    expected += q * payoff[a, b]
                    key = (a, b, lead + payoff[a, b] - payoff[b, a])
                    following[key] = following.get(key, 0.0) + q
        states = following
    win = sum(q * (1.0 if lead > 0 else 0.5 if lead == 0 else 0.0)
              for (_, _, lead), q in states.items())
    return expected, win


def snapshot_curve(run_dir: Path, rounds: int) -> list[tuple[int, float, float]]:
    """(policy env frames, exact best-response return, win rate) of every stored snapshot."""
    payoff = payoff_matrix()
    lines = (run_dir / "league" / "snapshots.jsonl").read_text().splitlines()
    curve = []
    for entry in map(json.loads, lines):
        table = action_table(run_dir, run_dir / "league" / entry["file"])
        curve.append((entry["env_frames"], *best_response(table, payoff, rounds)))
    return curve


# --- the runs -------------------------------------------------------------------------------

def slug(agent: str) -> str:
    """A file name for an agent."""
    return agent.replace("-", "")


def trained_frames(checkpoint: Path) -> int:
    """The env frames policy 0 itself trained on (its own agents' steps)."""
    import torch

    return int(torch.load(checkpoint, weights_only=True, map_location="cpu")["env_frames"])


def run_all(work: Path, frames: int, seeds: list[int], matches: int,
            rounds: int) -> dict[str, Any]:
    """Train both agents per seed, play them head to head, train and play a best response to
    each; every figure, with the wall time of each phase."""
    payoff, game_sets = payoff_matrix(), [f"env_kwargs={{rounds: {rounds}}}"]
    out: dict[str, Any] = {"agents": {}, "head_to_head": [], "seconds": {}}
    start = time.perf_counter()
    for seed in seeds:
        for agent, sets in AGENTS.items():
            run_dir = work / f"{slug(agent)}-{seed}"
            checkpoint = train(run_dir, frames, seed, [*game_sets, *sets])
            table = action_table(run_dir, checkpoint)
            out["agents"][agent, seed] = {
                "run": run_dir, "checkpoint": checkpoint, "table": table,
                "frames": trained_frames(checkpoint),
                "exact": best_response(table, payoff, rounds),
                "curve": snapshot_curve(run_dir, rounds)}
            print(f"{agent} seed {seed}: exact best response {out['agents'][agent, seed]['exact']}",
                  flush=True)
    out["seconds"]["train"] = time.perf_counter() - start
    start = time.perf_counter()
    for league_seed in seeds:
        for selfplay_seed in seeds:
            league, selfplay = out["agents"]["league", league_seed], \
                out["agents"]["self-play", selfplay_seed]
            played = head_to_head(league["run"], selfplay["checkpoint"], matches, 0,
                                  work / f"h2h-{league_seed}-{selfplay_seed}")
            out["head_to_head"].append({
                "league": league_seed, "self-play": selfplay_seed, "played": played,
                "exact": expected_match(league["table"], selfplay["table"], payoff, rounds)})
            print(f"league {league_seed} vs self-play {selfplay_seed}: win rate "
                  f"{played[:, 0].mean():.3f}", flush=True)
    out["seconds"]["head_to_head"] = time.perf_counter() - start
    start = time.perf_counter()
    for (agent, seed), result in out["agents"].items():
        run_dir = work / f"br-{slug(agent)}-{seed}"
        train(run_dir, frames, BEST_RESPONSE_SEED + seed,
              [*game_sets, *BEST_RESPONSE, f"fixed_opponents=[{result['checkpoint']}]"])
        result["best_response"] = head_to_head(run_dir, result["checkpoint"], matches, 0,
                                               work / f"br-h2h-{slug(agent)}-{seed}")
        print(f"best response to {agent} seed {seed}: win rate "
              f"{result['best_response'][:, 0].mean():.3f}", flush=True)
    out["seconds"]["best_response"] = time.perf_counter() - start
    return out


# --- the report -----------------------------------------------------------------------------

def pm(values: np.ndarray) -> str:
    """``mean ± half width`` of the 95 % interval."""
    mean, half = interval(values)
    return f"{mean:.3f} ± {half:.3f}"


def tables(out: dict[str, Any]) -> str:
    """The markdown tables of every figure."""
    lines = ["Head to head (`sfbus eval LEAGUE_RUN --opponent SELFPLAY_CHECKPOINT`, sampled "
             "actions; the league's side):", "",
             "| league seed | self-play seed | matches | league win rate (95 %) | league mean "
             "return (95 %) | exact win rate | exact mean return |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for pair in out["head_to_head"]:
        played, (ret, win) = pair["played"], pair["exact"]
        lines.append(f"| {pair['league']} | {pair['self-play']} | {len(played)} | "
                     f"{pm(played[:, 0])} | {pm(played[:, 1])} | {win:.3f} | {ret:+.3f} |")
    pooled = np.concatenate([p["played"] for p in out["head_to_head"]])
    lines.append(f"| all | all | {len(pooled)} | {pm(pooled[:, 0])} | {pm(pooled[:, 1])} | "
                 f"{np.mean([p['exact'][1] for p in out['head_to_head']]):.3f} | "
                 f"{np.mean([p['exact'][0] for p in out['head_to_head']]):+.3f} |")
    lines += ["", "Exploitability of each final policy (lower is less exploitable; 0.5 and 0 "
              "at the equilibrium): a best response trained for the same frames against it, "
              "frozen, played over the same matches; and the exact best response:", "",
              "| agent | seed | its own training frames | trained BR win rate (95 %) | trained "
              "BR mean return (95 %) | exact BR win rate | exact BR mean return | exact BR "
              "return over its snapshots, second half: mean (min-max) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (agent, seed), r in out["agents"].items():
        late = np.array([c[1] for c in r["curve"][len(r["curve"]) // 2:]])
        lines.append(f"| {agent} | {seed} | {r['frames']:,} | {pm(r['best_response'][:, 0])} | "
                     f"{pm(r['best_response'][:, 1])} | {r['exact'][1]:.3f} | "
                     f"{r['exact'][0]:+.3f} | {late.mean():.2f} ({late.min():.2f}-"
                     f"{late.max():.2f}) |")
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> None:
    """The exact best response's return against every snapshot of each run, by its frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for (agent, seed), r in out["agents"].items():
        frames, returns, _ = zip(*r["curve"], strict=True)
        axes.plot(frames, returns, "-" if agent == "league" else "--",
                  color="C0" if agent == "league" else "C3", alpha=0.8,
                  label=f"{agent}, seed {seed}")
    axes.set_xlabel("the policy's own training frames")
    axes.set_ylabel("exact best response's return per match")
    axes.set_title("Exploitability as it trains (0: the equilibrium)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def settings(rounds: int) -> str:
    """league_rps.yaml's settings as this benchmark ran them (the env's rounds set)."""
    import yaml

    shown = yaml.safe_load((REPO / TOPOLOGY).read_text())["settings"]
    shown["env_kwargs"] = {"rounds": rounds}
    return json.dumps(shown)


def report(out: dict[str, Any], args: argparse.Namespace, command: str) -> str:
    """The docs section: how it ran, then every figure."""
    from bench.throughput import machine

    seconds = ", ".join(f"{k} {v / 60:.1f} min" for k, v in out["seconds"].items())
    return "\n".join([
        f"`{command}` (this machine: {machine()}; {seconds} of wall time beside other work).",
        "",
        f"Game: rock-paper-scissors, matches of {args.rounds} round(s), each agent seeing its own "
        "and its opponent's last action in the match (`sfbus_components.envs.matrix_game`; "
        "with one round, nothing); its one equilibrium is uniform play. Every run stops at "
        f"{args.frames:,} env frames (of all agents); seeds {', '.join(map(str, args.seeds))}.",
        "",
        f"- `{TOPOLOGY}` settings: `{settings(args.rounds)}`, and for every run "
        f"`{' '.join(f'--set {s}' for s in COMMON)} --set seed=SEED`;",
        *(f"- {agent}: `{' '.join(f'--set {s}' for s in sets)}`" for agent, sets in
          AGENTS.items()),
        f"- best response: `{' '.join(f'--set {s}' for s in BEST_RESPONSE)} --set "
        f"fixed_opponents=[CHECKPOINT] --set seed={BEST_RESPONSE_SEED}+SEED`, a fresh policy "
        "against the agent's final checkpoint in both opponent slots;",
        f"- every evaluation: `sfbus eval RUN --opponent FILE --episodes {args.matches} --envs 16`"
        " (sampled actions); the interval is the normal one over its matches (a match 1, 0.5 "
        "or 0), match noise only, not the spread over seeds, which the rows show.",
        "",
        tables(out),
        "",
        f"![exact exploitability of every snapshot]({PLOT.format(rounds=args.rounds)})",
    ])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print its tables, optionally write its docs section and plot."""
    parser = argparse.ArgumentParser(prog="python -m bench.league_vs_selfplay",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=100_000,
                        help="env frames of every training run (default: 100000)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2],
                        help="seeds of the agents (default: 1 2)")
    parser.add_argument("--matches", type=int, default=2000,
                        help="matches of every evaluation (default: 2000)")
    parser.add_argument("--rounds", type=int, default=8,
                        help="rounds a match (default: 8, league_rps.yaml's)")
    parser.add_argument("--work-dir", type=Path,
                        help="folder for the runs (default: a new one under the temp folder)")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"write docs/benchmarks/{DOC} and its plot")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="league_vs_selfplay-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"runs in {work}", flush=True)
    out = run_all(work, args.frames, args.seeds, args.matches, args.rounds)
    command = "python -m bench.league_vs_selfplay " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(tables(out))
    if args.write_docs:
        plot(out, REPO / "docs" / "benchmarks" / PLOT.format(rounds=args.rounds))
        write_section(DOC, SECTION.format(rounds=args.rounds), report(out, args, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
