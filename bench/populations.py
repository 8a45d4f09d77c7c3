"""Throughput of a population vs one policy, and of batched vs non-batched sampling.

``python -m bench.populations [--seconds S] [--warmup W] [--cases A,B] [--write-docs]`` runs the
cases below one after another, each in fresh processes, the sfbus training cases under ``sfbus
run`` with the machine's default rollout workers (one per core) and 16 envs each, but for the
first two, which run ``pbt8``'s 32, and the duels, which keep their topology's layout:

1. one policy on ``pbt8``'s scenario and data path (defend_the_center with its reward shaping,
   batch 2048): ``topologies/doom_basic.yaml`` with those settings;
2. ``topologies/pbt8.yaml``: the same envs shared by 8 policies (8 learners in one process,
   one inference worker serving all 8), PBT at its default 5M-frame interval;
3. ``topologies/doom_basic.yaml``: non-batched sampling (the default);
4. ``topologies/doom_basic_batched.yaml``: the same with batched sampling;
5. and 6. self-play vs bots, as pure simulation (random actions, the processes of
   :func:`bench.throughput.pure_simulation`): networked 1v1 matches (``doom_duel``, two engines in
   lock-step per match) against single-player games with one built-in bot on the same map
   (``doom_deathmatch`` with ``num_bots: 1``), the same number of agents per core; and 7. full
   self-play training, ``topologies/selfplay_duel.yaml``; 8. ``doom_basic.yaml`` with an evaluator
   (``sfbus_components.evaluation.evaluator``, its default 10 episodes) every 10 s, beside case 3;
9. Sample Factory 2.1.1's own duel self-play (``doom_duel``, its PBT) in its venv
   (:mod:`bench.sample_factory`), configured as ``selfplay_duel.yaml``: 4 policies, its rollout
   workers, matches per worker and splits (:func:`selfplay_layout`), rollout 32, batch 512,
   reward scale 0.5, one-minute matches; 10. ``topologies/league_duel.yaml``, case 7's population
   whose learners meet frozen snapshots in half the matches (two opponent slots served by the
   same inference actors; their frames count, as every agent's frames do, but never train).

Rates and CPU shares are measured as in :mod:`bench.throughput` (its ``Window``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench import sample_factory, throughput
from bench import throughput_topologies as tt
from bench.report import write_section

DOC = "populations.md"
SECTION = "## Populations and batched sampling"
PBT8_ENVS = "num_envs=32"  # pbt8.yaml's: the population and its one-policy baseline alike
SINGLE_ON_PBT8 = [PBT8_ENVS, "env=doom_defend_the_center", "batch_size=2048", "reward_scale=0.1",
                  "env_kwargs={reward_shaping: {damage: 0.003, death: -0.25}}"]
CASES = {
    "single": ("one policy (pbt8's scenario)", "topologies/doom_basic.yaml", SINGLE_ON_PBT8),
    "pbt8": ("pbt8: 8 policies", "topologies/pbt8.yaml", [PBT8_ENVS]),
    "nonbatched": ("doom_basic, non-batched", "topologies/doom_basic.yaml", []),
    "batched": ("doom_basic, batched", "topologies/doom_basic_batched.yaml", []),
    "sim_bots": ("simulation: single player + 1 bot", "doom_deathmatch", {"num_bots": 1}),
    "sim_duel": ("simulation: networked duels", "doom_duel", {}),
    "selfplay": ("self-play training, 4 policies", "topologies/selfplay_duel.yaml", []),
    "league_duel": ("league self-play training, 4 policies + 2 opponent slots",
                    "topologies/league_duel.yaml", []),
    "sf_selfplay": ("Sample Factory 2.1.1: self-play training, 4 policies", "doom_duel",
                    ["--num_policies=4", "--with_pbt=True", "--pbt_period_env_steps=5000000",
                     "--pbt_replace_reward_gap_absolute=0.35", "--batch_size=512",
                     "--reward_scale=0.5", "--timelimit=1.0"]),
    "evaluated": ("doom_basic + evaluator every 10 s", "topologies/doom_basic.yaml",
                  ["processes.evaluator.nice=10",
                   "processes.evaluator.actors.evaluator.class=sfbus_components.evaluation.evaluator:Evaluator",
                   "processes.evaluator.actors.evaluator.params.interval_s=10"]),
}
AGENTS_PER_CORE = 4  # simulation cases: 4 single-player games, or 2 duels of 2 agents
COMMON = ["num_envs=16", *(f"{k}={v}" for k, v in tt.REPORTING.items())]
REPORTING_SETS = [f"{k}={v}" for k, v in tt.REPORTING.items()]


def run(key: str, warmup: float, seconds: float) -> tt.Window:
    """One case in fresh processes."""
    _, topology, sets = CASES[key]
    if key == "sf_selfplay":
        workers, envs, splits = selfplay_layout()
        return sample_factory.run_training(seconds, warmup, topology, workers=workers, envs=envs,
                                           extra_flags=(*sets, f"--worker_num_splits={splits}"))
    if key.startswith("sim_"):
        envs = AGENTS_PER_CORE // (2 if key == "sim_duel" else 1)
        return throughput.pure_simulation(topology, os.cpu_count() or 1, envs, warmup, seconds,
                                          dict(sets))
    common = REPORTING_SETS if key in ("selfplay", "league_duel") else COMMON
    # the case's own settings last: they override the common ones
    args = [topology, *(a for s in [*common, *sets] for a in ("--set", s))]
    with tempfile.TemporaryDirectory(prefix="sfbus-bench-") as tmp:
        return tt.run_sfbus(args, warmup, seconds, Path(tmp))


def selfplay_layout() -> tuple[int, int, int]:
    """``selfplay_duel.yaml``'s rollout workers, matches per worker and splits, which Sample
    Factory's duel case gets too."""
    process, rollout = tt.resolved_actors(CASES["selfplay"][1])["rollout"]
    return process.replicas, rollout.params.num_envs, rollout.params.num_splits


# The comparisons the issues ask for: (case, its baseline, what the ratio means).
COMPARISONS = (
    ("pbt8", "single", "pbt8 runs at {r:.2f}x the frame rate of one policy on the same envs (the "
                       "paper: 146.4k vs 153.6k FPS, 0.95x, for 12 vs 4 agents)."),
    ("batched", "nonbatched", "Batched sampling runs at {r:.2f}x non-batched."),
    ("evaluated", "nonbatched", "Training with an evaluator every 10 s runs at {r:.2f}x training "
                                "without one."),
    ("selfplay", "sf_selfplay", "Self-play duel training runs at {r:.2f}x Sample Factory's own "
                                "(its doom_duel PBT, same policies, matches and batch)."),
    ("league_duel", "sf_selfplay", "League duel training (half the matches against frozen "
                                   "snapshots) runs at {r:.2f}x Sample Factory's duel self-play."),
    ("league_duel", "selfplay", "League duel training runs at {r:.2f}x plain self-play."),
    ("sim_duel", "sim_bots", "Networked duels simulate at {r:.2f}x the agent frames of "
                             "single-player games with a bot (the paper: 2-3x slower)."),
)


def ratios(results: dict[str, tt.Window]) -> str:
    """The comparisons whose two cases ran, one line each."""
    return "\n".join(f"- {text.format(r=results[case].rate / results[base].rate)}"
                     for case, base, text in COMPARISONS if case in results and base in results)


def main(argv: list[str] | None = None) -> int:
    """Run the cases in turn; print (and optionally write) the tables."""
    parser = argparse.ArgumentParser(prog="python -m bench.populations", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per case")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after first frames")
    parser.add_argument("--cases", default=",".join(CASES), help="subset of " + ", ".join(CASES))
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs section")
    args = parser.parse_args(argv)
    keys = [k for k in args.cases.split(",") if k]
    if bad := [k for k in keys if k not in CASES]:
        parser.error(f"unknown case(s) {bad}; known: {list(CASES)}")
    results: dict[str, tt.Window] = {}
    for key in keys:
        results[key] = w = run(key, args.warmup, args.seconds)
        print(f"{CASES[key][0]:>30} | {w.rate:>9,.0f} env frames/s | {w.cores:.2f} cores "
              f"(others {w.others:.2f})", flush=True)
    names = {k: CASES[k][0] for k in results}
    rows = ["| case | command | env frames/s | cores used | others' cores | memory RSS / PSS |",
            "| --- | --- | ---: | ---: | ---: | ---: |"]
    for key, w in results.items():
        _, topology, sets = CASES[key]
        if key.startswith("sim_"):
            command = f"pure simulation of {topology} {sets or ''}".strip()
        elif key == "sf_selfplay":
            command = w.extra["flags"]
        else:
            command = " ".join([topology, *(f"--set '{s}'" for s in sets)])
        rows.append(f"| {names[key]} | `{command}` | {w.rate:,.0f} | {w.cores:.2f} | "
                    f"{w.others:.2f} | {w.rss / 2**30:.2f} / {w.pss / 2**30:.2f} GiB |")
    text = f"{ratios(results)}\n\n" + "\n".join(rows)
    print("\n" + text)
    if args.write_docs:
        command = "python -m bench.populations " + " ".join(
            sys.argv[1:] if argv is None else argv)
        about = (f"Full training, one case after another in fresh processes, every case with "
                 f"`--set {' --set '.join(COMMON)}` (one rollout worker per core, pinned) before "
                 f"its own settings (so pbt8 and its one-policy baseline run {PBT8_ENVS}). A rate "
                 f"is env frames/s over a {args.seconds:g} s window {args.warmup:g} s after the "
                 f"first frames, as in the throughput section.")
        write_section(DOC, SECTION, f"Command: `{command.strip()}`\n\nMachine: "
                               f"{throughput.machine()}\n\n{about}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
