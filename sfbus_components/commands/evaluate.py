"""``sfbus eval RUN_DIR``: score a run's policies over many seeded episodes into CSV files.

Each policy of the run (or those named by ``--policy``) plays ``--episodes`` env episodes on
``--envs`` envs in this process, acting for all of them in one batched, packed inference call
per step (:mod:`sfbus_components.evaluation.seeded_episodes`). Episode ``k`` starts from seed
``--seed + k``, so a row can be replayed alone (``sfbus enjoy --seed``).
``OUT/eval_policy_<id>.csv`` gets one row per agent-episode,
``seed,agent,return,true_return,length`` (``true_return`` empty where the env reports no unshaped
score), sorted by seed, then a ``mean`` row over them. With ``--opponent FILE`` (a league
snapshot, ``RUN_DIR/league/snapshot_*.pt``, or a learner checkpoint of the same env and model,
from any run) agents 1.. of every episode play that fixed opponent: the rows are the evaluated
policy's (agent 0) with a ``win`` column (1, 0.5 a draw, 0, as the env reports the match). In a
run of heterogeneous agents (``agent_policies``) a policy plays its own agents, and the rows are
theirs; every other agent acts with its own policy's newest checkpoint (as ``sfbus enjoy``).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from sfbus import BadInput
from sfbus_components.commands.enjoy import (
    EnjoyError,
    agents_players,
    build_from_checkpoint,
    check_seeds,
    learners,
    make_play_env,
    read_checkpoint,
)
from sfbus_components.commands.hub import run_directory
from sfbus_components.commands.outputs import check_writable_dir

BAD_INPUT = 2
COLUMNS = ("seed", "agent", "return", "true_return", "length")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``eval`` sub-command (the ``sfbus.commands`` entry point)."""
    parser = subparsers.add_parser(
        "eval", help="score a run's policies over seeded episodes (CSV)",
        description="Play N seeded episodes per policy on M envs with batched inference; write "
                    "one CSV per policy, a row per episode and a mean row.")
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="run directory of `sfbus run`, or hub:user/name")
    parser.add_argument("--policy", type=int, action="append", metavar="N",
                        help="policy id (repeatable; default: every policy of the run)")
    parser.add_argument("--checkpoint", metavar="PATH|best",
                        help="checkpoint file, or 'best' (default: each policy's newest)")
    parser.add_argument("--episodes", type=int, default=10, metavar="N",
                        help="env episodes per policy (default: 10)")
    parser.add_argument("--envs", type=int, default=4, metavar="M",
                        help="envs played side by side (default: 4)")
    parser.add_argument("--deterministic", action="store_true",
                        help="take the most likely action instead of sampling")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the first episode; episode k uses SEED + k (default: 0)")
    parser.add_argument("--out", metavar="DIR", help="folder for the CSV files "
                                                     "(default: RUN_DIR/eval)")
    parser.add_argument("--opponent", metavar="FILE",
                        help="a league snapshot or a learner checkpoint (same env and model) "
                             "that plays agents 1.. of every episode; rows: agent 0, with wins")
    parser.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    """Run ``sfbus eval``; bad input is one ``error:`` line on stderr and exit code 2."""
    run_dir = run_directory(args.run_dir)
    out = Path(args.out) if args.out else run_dir / "eval"
    try:
        jobs = _check(args, run_dir)
        check_writable_dir(out, "--out")  # the last check: a refusal leaves no folder behind
    except EnjoyError as error:  # one line, exit 2: printed by the CLI (a newline shows as \n)
        raise BadInput(str(error)) from None
    for params, path, state, opponent in jobs:
        start = time.perf_counter()
        rows = evaluate(params, state, run_dir, episodes=args.episodes, envs=args.envs,
                        deterministic=args.deterministic, first_seed=args.seed,
                        opponent=opponent)
        csv_path = out / f"eval_policy_{params.policy}.csv"
        mean = write_csv(csv_path, rows, wins=opponent is not None)
        against = "" if opponent is None else \
            f" against {Path(args.opponent).name}: win rate {mean['win']:.3f},"
        print(f"policy {params.policy} ({path.name}, version {state['version']}){against} mean "
              f"return {mean['return']:.3f}, mean length {mean['length']:.1f} over {len(rows)} "
              f"episodes in {time.perf_counter() - start:.1f} s -> {csv_path}")
    return 0


def _check(args: argparse.Namespace, run_dir: Path) -> list[tuple[Any, Path, dict, Any]]:
    """Every policy to evaluate with its checkpoint and opponent (None: none), read before
    anything plays."""
    if args.episodes < 1:
        raise EnjoyError(f"--episodes must be >= 1, not {args.episodes}")
    if args.envs < 1:
        raise EnjoyError(f"--envs must be >= 1, not {args.envs}")
    check_seeds(args.seed, args.episodes)
    found = learners(run_dir)
    wanted = args.policy or sorted(found)
    for policy in wanted:
        if policy not in found:
            raise EnjoyError(f"--policy {policy}: {run_dir} has no such policy (it trains "
                             f"{', '.join(str(p) for p in sorted(found))})")
        if args.opponent is not None and found[policy].data.agent_policies:
            raise EnjoyError(f"--opponent: policy {policy} plays beside agents of other spaces "
                             f"(agent_policies {found[policy].data.agent_policies}), each with "
                             "its own policy: there are no agents 1.. for an opponent to play")
    if args.checkpoint not in (None, "best") and len(wanted) > 1:
        raise EnjoyError(f"--checkpoint {args.checkpoint}: a file holds one policy; choose it "
                         f"with --policy")
    return [(found[p], *read_checkpoint(run_dir, found[p], args.checkpoint),
             None if args.opponent is None else read_opponent(Path(args.opponent), found[p]))
            for p in dict.fromkeys(wanted)]


def read_opponent(path: Path, params: Any) -> Any:
    """The fixed opponent in ``path`` (a league snapshot or a learner checkpoint) as a policy of
    the run's env and model; ``EnjoyError`` when it is not one, or does not fit."""
    from sfbus_components.envs import env_spec
    from sfbus_components.league.store import load_opponent
    from sfbus_components.models.policy import Policy

    spec = env_spec(params.data.env, **params.data.env_kwargs)
    if spec.num_agents < 2:
        raise EnjoyError(f"--opponent {path}: env {params.data.env} has one agent; an opponent "
                         f"plays agents 1.. of a multi-agent env")
    policy = Policy(spec, params.data.model)
    try:
        load_opponent(path, policy)
    except ValueError as error:
        raise EnjoyError(f"--opponent {path}: {error}") from None
    return policy.prepare_for_inference()


def evaluate(params: Any, state: dict, run_dir: Path, *, episodes: int, envs: int,
             deterministic: bool, first_seed: int, opponent: Any = None) -> list[Any]:
    """Play ``episodes`` seeded episodes of the checkpoint ``state`` of a policy of the run in
    ``run_dir``; their rows by seed (with an ``opponent`` playing agents 1.., agent 0's rows; in
    a run of heterogeneous agents, the policy's own agents' rows, the others played by their
    policies' newest checkpoints)."""
    import torch
    from tqdm import tqdm

    from sfbus_components.evaluation.seeded_episodes import SeededEpisodes

    played = [make_play_env(params, render=False)
              for _ in range(min(envs, episodes))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batches of a few rows: more threads only contend for the cores
    try:
        spec = played[0].spec
        if opponent is None:
            players, counted = agents_players(run_dir, params, state, spec)
        else:
            policy = build_from_checkpoint(spec, params, state)
            players, counted = [policy] + [opponent] * (spec.num_agents - 1), [0]
        runner = SeededEpisodes(played, players, params.data.state_size,
                                deterministic=deterministic, first_seed=first_seed)
        # tqdm shows itself only on a terminal (disable=None): logs and pipes stay clean
        with tqdm(total=episodes, desc=f"policy {params.policy}", unit="episode",
                  disable=None, file=sys.stderr) as bar:
            rows = runner.play(episodes, on_episode=lambda rows: bar.update(1))
        return [r for r in rows if r.agent in counted]
    finally:
        torch.set_num_threads(threads)
        for env in played:
            env.close()


def write_csv(path: Path, rows: list[Any], wins: bool = False) -> dict[str, float]:
    """Write the episodes' rows and their ``mean`` row, with a ``win`` column when ``wins``
    (against an opponent); returns the means."""
    mean = {
        "return": sum(r.episode_return for r in rows) / len(rows),
        "length": sum(r.length for r in rows) / len(rows),
    }
    for name in ("true_return", "win"):
        found = [getattr(r, name) for r in rows if not math.isnan(getattr(r, name))]
        mean[name] = sum(found) / len(found) if found else math.nan
    win = (lambda value: (_blank_nan(value),)) if wins else (lambda value: ())
    # whole or not at all: a killed eval, or two at once into one folder, never leave a CSV
    # that is half of one and half of the other
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with partial.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow((*COLUMNS, *(("win",) if wins else ())))
            for r in rows:
                writer.writerow((r.seed, r.agent, repr(r.episode_return),
                                 _blank_nan(r.true_return), r.length, *win(r.win)))
            writer.writerow(("mean", "", repr(mean["return"]), _blank_nan(mean["true_return"]),
                             repr(mean["length"]), *win(mean["win"])))
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return mean


def _blank_nan(value: float) -> str:
    return "" if math.isnan(value) else repr(value)
