"""Learning side by side with Sample Factory 2.1.1: reward against env frames and wall time.

``python -m bench.learning_vs_sf --env atari_breakout --frames N [--seeds 0,1] [--systems
sfbus,sample_factory] [--write-docs]`` trains the env family's topology with ``sfbus run TOPOLOGY
--max-frames N`` and then Sample Factory's own example (``sf_examples.vizdoom.train_vizdoom``,
``sf_examples.atari.train_atari`` or ``sf_examples.mujoco.train_mujoco``, from its venv,
:mod:`bench.sample_factory`) to the same env frames, one run after another, never two at once.
Sample Factory gets the topology's settings as its flags (:func:`sf_flags`): same workers, envs
per worker, splits, rollout, batch, epochs, minibatches, optimiser, losses, model and seed, so the
two differ in the system, not the recipe.

Each run keeps its folder under ``runs/learning_vs_sf/ENV/SYSTEM-seedK`` (ignored by git), with
``progress.jsonl`` (Sample Factory's written by a handler beside its runner's own: env frames and
its 100-episode means at every training iteration) and ``wall.json`` (launch to exit); a finished
run is not trained again, so ``--write-docs`` can redraw from runs already made. Both are
compared on one measure, ``true_reward``: for Atari the whole game's raw score (sfbus's
``episode_true_return``, Sample Factory's ``RecordEpisodeStatistics`` reward), for VizDoom the
game's own reward before shaping (Sample Factory's ``true_objective``; for ``basic`` scaled by
its 0.01, which the tables undo), for MuJoCo the episode's reward.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import learning, sample_factory
from bench import throughput_topologies as tt
from bench.report import DOCS, write_section
from bench.report import machine as machine_line
from sfbus_components.algo.ppo import AppoConfig
from sfbus_components.commands.plot import Progress, plot_runs, read_progress
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.models import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "learning_vs_sf"
DOC = "learning_vs_sf.md"
SYSTEMS = ("sfbus", "sample_factory")
# sfbus writes a progress record per second, about as often as Sample Factory writes one per
# training iteration (4k env frames on doom_basic), so both curves cross a bar at one resolution.
SFBUS_REPORTING = ("report_every_s=1",)


@dataclass(frozen=True)
class Family:
    """An env compared: its topology, Sample Factory's script, reward bars."""

    topology: str
    sf_module: str
    bars: tuple[float, ...]
    measure: str = "raw game score"
    key: str = "true_reward"
    """The progress key both systems report the measure under."""
    notes: str = ""
    """What still differs between the two, for the docs."""
    sets: tuple[str, ...] = ()
    """``--set`` overrides of the topology, for sfbus's run and Sample Factory's flags alike."""
    sf_overrides: tuple[str, ...] = ()
    """Sample Factory flags that replace the recipe's, where Sample Factory refuses the recipe."""
    sf_factor: float = 1.0
    """Sample Factory's measure times this is sfbus's (it reports doom_basic's scaled reward)."""


DOOM_NOTES = (
    "Same scenario on both sides as Sample Factory trains it (its action space, reward scale, "
    "gathering shaping and its own cfg's rewards, buttons and HUD: "
    "`sfbus_components/envs/doom/scenarios.py`), same model (conv_simple encoder, GRU 512, "
    "input and "
    "return normalisation), 160x120 frames resized to 128x72, frameskip 4, same workers, envs, "
    "rollout and batch. Each system learns with its own VizDoom defaults: Sample Factory with its "
    "`doom_override_defaults` (symmetric-KL exploration 0.001, value clip 0.2) and GAE (lambda "
    "0.95; it refuses V-trace with normalised returns), sfbus with `doom_basic.yaml`'s settings (as"
    " of 2026-11-25 Sample Factory's VizDoom recipe above, its initialization, and one batch "
    "waiting for the learner) and those in its command. Sample Factory counts an env frame when its"
    " learner has trained on it, sfbus when it is sampled (on doom_basic 8-11k frames, two or three"
    " batches, earlier; the table gives both at the top bar). Left as each system has it: Sample "
    "Factory runs its inference worker as a third process (sfbus hosts one in each rollout process)"
    " and decorrelates its envs at start (random steps, not counted as frames, but in its wall "
    "time). The curves' time axis starts at launch for Sample Factory and at sfbus's stats actor's "
    "start for sfbus; the wall-time column is launch to exit for both.")
# Sample Factory's VizDoom defaults (its doom_override_defaults) and its GAE
SF_DOOM = ("--with_vtrace=False", "--exploration_loss=symmetric_kl",
           "--exploration_loss_coeff=0.001", "--ppo_clip_value=0.2")
FAMILIES = {
    "doom_basic": Family(
        "topologies/doom_basic.yaml", "sf_examples.vizdoom.train_vizdoom", (50.0, 70.0),
        measure="game reward", sets=("env=doom_basic",), notes=DOOM_NOTES, sf_factor=100.0,
        sf_overrides=SF_DOOM),
    "doom_health_gathering_supreme": Family(
        "topologies/doom_basic.yaml", "sf_examples.vizdoom.train_vizdoom", (6.0, 10.0, 15.0),
        measure="game reward (0.01 per tic alive)",
        sets=("env=doom_health_gathering_supreme",), notes=DOOM_NOTES,
        sf_overrides=SF_DOOM),
    "doom_defend_the_center": Family(
        "topologies/doom_basic.yaml", "sf_examples.vizdoom.train_vizdoom", (5.0, 10.0, 15.0),
        measure="game reward (kills)", sets=("env=doom_defend_the_center",), notes=DOOM_NOTES,
        sf_overrides=SF_DOOM),
    "doom_battle": Family(
        "topologies/doom_battle.yaml", "sf_examples.vizdoom.train_vizdoom", (2.0, 5.0, 10.0),
        measure="kills per episode (the game's reward)", notes=(
            "Battle as Sample Factory trains it on both sides (its cfg and map, five heads with "
            "turning in 11 steps, its 23 measurements and its shaping: "
            "`sfbus_components/envs/doom/scenarios.py`), Sample Factory's VizDoom model "
            "(conv_simple "
            "beside an MLP of the measurements, GRU 512, input normalisation), 160x120 frames "
            "resized to 128x72, frameskip 4, and Sample Factory's own Battle settings on both "
            "sides (`topologies/doom_battle.yaml`: V-trace, no return normalisation, batch 2048, "
            "no gradient clipping, two batches in flight, symmetric-KL exploration 0.001, value "
            "clip 0.2), same workers, envs, rollout and seed. Left as each system has it: Sample "
            "Factory runs its inference worker as a third process (sfbus hosts one in each "
            "rollout process) and decorrelates its envs at start. Neither bootstraps the value "
            "at Battle's time limit (both `value_bootstrap` off, Sample Factory's default). The "
            "curves' time axis starts at launch for Sample Factory and at "
            "sfbus's stats actor's start for sfbus; the wall-time column is launch to exit for "
            "both.")),
    "atari_breakout": Family(
        "topologies/atari_breakout.yaml", "sf_examples.atari.train_atari", (2.0, 5.0, 10.0),
        notes=(
            "Same env chain on both sides (BreakoutNoFrameskip-v4's settings: no sticky actions, "
            "30 no-op starts, frameskip 4 with max-pool, episodic life, FIRE on reset, clipped "
            "rewards, 84x84 grey, 4 frames), same Nature CNN, no RNN. Left as each system has "
            "it: Sample Factory runs its inference worker as a third process (sfbus hosts one in "
            "each rollout process) and decorrelates its envs at start (random steps, not counted "
            "as frames, but in its wall time); Sample Factory's Atari default `lr_schedule="
            "linear_decay` is replaced by the constant rate of sfbus's Atari topology. Both "
            "collect synchronously (Sample Factory's Atari default `async_rl=False`, sfbus's "
            "`mode: sync`), 2 workers x 8 envs, one batch per round; both shuffle the "
            "minibatches (sfbus's default; Sample Factory's Atari default is buffer order) and "
            "initialize orthogonally with gain 1 (Sample Factory's default). The "
            "curves' time axis starts at launch for Sample Factory and at sfbus's stats actor's "
            "start (a few seconds after launch) for sfbus; the wall-time column is launch to "
            "exit for both.")),
    "mujoco_halfcheetah": Family(
        "topologies/mujoco_halfcheetah.yaml", "sf_examples.mujoco.train_mujoco",
        (0.0, 1000.0, 2000.0), measure="episode reward", key="reward", notes=(
            "sfbus trains gymnasium 1's HalfCheetah-v5, Sample Factory gymnasium 0.29's "
            "HalfCheetah-v4 (its own env; the same body, reward and 1000-step limit). sfbus "
            "clips actions to the Box on their way to the env, Sample Factory sends them "
            "unclipped (MuJoCo clamps the controls; the control cost sees the raw action). "
            "Both decay the learning rate linearly to 0 over the frames of the run (Sample "
            "Factory's MuJoCo default; `--set appo.lr_schedule=linear_decay` for sfbus); both "
            "have its KL penalty of 0.1 and PyTorch's default initialization, and both collect "
            "synchronously (its `async_rl=False`, sfbus's `mode: sync`), 2 workers x 8 envs. "
            "The minibatches are 256 samples on both sides (Sample Factory's MuJoCo default is "
            "1024). The curves' time axis starts "
            "at launch for Sample Factory and at sfbus's "
            "stats actor's start for sfbus; the wall-time column is launch to exit for both."),
        sets=("appo.lr_schedule=linear_decay",)),
}


def topology_settings(family: Family) -> tuple[DataPathParams, AppoConfig, int]:
    """The rollout workers' and the learner's resolved params, and the rollout workers."""
    actors = tt.resolved_actors(family.topology, family.sets)
    process, rollout = actors["rollout"]
    return rollout.params, actors["learner"][1].params.appo, process.replicas


def sf_flags(family: Family, env: str, frames: int, seed: int, train_dir: Path) -> list[str]:
    """Sample Factory's flags for the recipe the topology sets (on the CPU)."""
    data, appo, workers = topology_settings(family)
    minibatch = data.batch_size // appo.num_batches_per_epoch
    # Sample Factory 2.1.1's --lr_schedule refuses linear_decay (not among its choices), which
    # its Atari and MuJoCo scripts set as their default: that default is left to give it.
    schedule = [] if appo.lr_schedule == "linear_decay" else [f"--lr_schedule={appo.lr_schedule}"]
    recipe = [f"--env={env}", "--device=cpu", f"--seed={seed}", f"--train_for_env_steps={frames}",
            f"--num_workers={workers}", f"--num_envs_per_worker={data.num_envs}",
            f"--worker_num_splits={data.num_splits}", f"--rollout={data.rollout}",
            f"--batch_size={minibatch}", f"--num_batches_per_epoch={appo.num_batches_per_epoch}",
            f"--num_epochs={appo.num_epochs}", f"--async_rl={data.mode == 'async'}",
            f"--learning_rate={appo.lr}", *schedule,
            f"--lr_schedule_kl_threshold={appo.lr_schedule_kl_threshold}",
            f"--shuffle_minibatches={appo.shuffle_minibatches}", f"--adam_eps={appo.adam_eps}",
            f"--max_grad_norm={appo.max_grad_norm}", f"--gamma={appo.gamma}",
            f"--gae_lambda={appo.gae_lambda}", f"--with_vtrace={appo.with_vtrace}",
            f"--ppo_clip_ratio={appo.ppo_clip_ratio}", f"--ppo_clip_value={appo.ppo_clip_value}",
            f"--exploration_loss={appo.exploration_loss}",
            f"--exploration_loss_coeff={appo.entropy_coeff}",
            f"--recurrence={appo.recurrence or data.rollout}",
            f"--value_loss_coeff={appo.value_loss_coeff}",
            f"--kl_loss_coeff={appo.kl_loss_coeff}",
            f"--normalize_returns={appo.normalize_returns}",
            f"--value_bootstrap={appo.value_bootstrap}",
            *model_flags(data.model), "--serial_mode=False", "--with_wandb=False",
            f"--train_dir={train_dir}", "--experiment=run"]
    replaced = {flag.split("=", 1)[0] for flag in family.sf_overrides}
    return [f for f in recipe if f.split("=", 1)[0] not in replaced] + list(family.sf_overrides)


def model_flags(model: ModelConfig) -> list[str]:
    """Sample Factory's flags for the same network as sfbus's ``model`` settings."""
    if model.core not in ("none", "gru", "lstm"):
        raise SystemExit(f"model.core {model.core!r} has no Sample Factory counterpart here")
    encoder = {"nature_cnn": ["--encoder_conv_architecture=convnet_atari"],
               "conv_simple": ["--encoder_conv_architecture=convnet_simple",
                               f"--encoder_conv_mlp_layers={model.hidden}"],
               "mlp": ["--encoder_mlp_layers", *map(str, model.mlp_layers)]}
    encoder["auto"] = encoder["conv_simple"]  # the images-only envs compared here
    if model.encoder not in encoder:
        raise SystemExit(f"model.encoder {model.encoder!r} has no Sample Factory counterpart here")
    core = ["--use_rnn=False"] if model.core == "none" else [
        "--use_rnn=True", f"--rnn_type={model.core}", f"--rnn_size={model.core_size}",
        f"--rnn_num_layers={model.rnn_num_layers}"]
    init = [f"--policy_initialization={model.policy_initialization}"]
    if model.policy_init_gain is not None:
        init.append(f"--policy_init_gain={model.policy_init_gain}")
    elif model.policy_initialization != "torch_default":
        raise SystemExit("sfbus's own init gains (model.policy_init_gain unset) have no Sample "
                         "Factory counterpart: set model.policy_init_gain")
    return [*encoder[model.encoder], *core, *init, f"--nonlinearity={model.nonlinearity}",
            f"--normalize_input={model.normalize_input}",
            f"--adaptive_stddev={model.adaptive_stddev}",
            f"--initial_stddev={model.initial_stddev}",
            f"--continuous_tanh_scale={model.continuous_tanh_scale}"]


def run_folder(env: str, system: str, seed: int) -> Path:
    """Where one run's records live."""
    return RUNS / env / f"{system}-seed{seed}"


def train(env: str, system: str, seed: int, frames: int) -> Path:
    """Train one run to ``frames`` unless its folder already holds a finished one."""
    folder = run_folder(env, system, seed)
    if (folder / "wall.json").is_file():
        return folder
    family = FAMILIES[env]
    started = time.time()
    if system == "sfbus":
        learning.train(f"{system}-seed{seed}", family.topology,
                       [*family.sets, *SFBUS_REPORTING, f"seed={seed}"], frames, folder.parent)
    else:
        python = sample_factory.ensure_venv()
        folder.mkdir(parents=True, exist_ok=True)
        flags = sf_flags(family, env, frames, seed, folder / "train_dir")
        (folder / "progress.jsonl").unlink(missing_ok=True)
        print(f"{system}-seed{seed}: {' '.join(flags)}", flush=True)
        with (folder / "output.txt").open("wb") as out:
            # Its own session, so that an interrupted benchmark stops the whole tree.
            proc = subprocess.Popen([str(python), "-m", "bench.sample_factory", "--inside",
                                     "train", "--folder", str(folder), "--", *flags], cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if proc.wait():
                raise SystemExit(f"{system}-seed{seed} failed: see {folder / 'output.txt'}")
        finally:
            sample_factory._stop(proc)
    (folder / "wall.json").write_text(json.dumps(
        {"started": started, "wall_s": time.time() - started, "frames": frames}))
    return folder


def load(env: str, system: str, seed: int) -> tuple[Progress, float]:
    """One finished run's records on a time axis from its launch, and its wall time."""
    folder = run_folder(env, system, seed)
    wall = json.loads((folder / "wall.json").read_text())
    run = read_progress(folder)
    run.name = f"{'Sample Factory 2.1.1' if system == 'sample_factory' else 'sfbus'} seed {seed}"
    if system == "sample_factory":  # its records carry the epoch time of the moment
        run.time = [t - wall["started"] for t in run.time]
    # The one measure both are compared on, under the key the figures draw.
    family = FAMILIES[env]
    factor = family.sf_factor if system == "sample_factory" else 1.0
    # Frames trained on: Sample Factory's own count; sfbus's learner reports it beside the
    # frames sampled (its records' env_frames).
    sfbus = system == "sfbus"
    run.policies = [{"0": {"reward": r["0"][family.key] * factor,
                           "trained": r["0"].get("trained_frames") if sfbus else frames}}
                    if family.key in r.get("0", {}) else {}
                    for r, frames in zip(run.policies, run.frames, strict=True)]
    return run, wall["wall_s"]


def at_frames(run: Progress, frames: int) -> float:
    """The measure's last report at or before ``frames`` env frames (nan if none)."""
    xs, ys = run.series("0", "reward", "frames")
    before = [y for x, y in zip(xs, ys, strict=True) if x <= frames]
    return before[-1] if before else float("nan")


def table(env: str, runs: list[tuple[Progress, float]]) -> str:
    """Markdown: one row per run."""
    bars = FAMILIES[env].bars
    equal = min(r.frames[-1] for r, _ in runs)
    head = (f"| run | {FAMILIES[env].measure} at {equal / 1e6:.2f}M frames | "
            + " | ".join(f"{b:g} reached: frames, s" for b in bars)
            + f" | {bars[-1]:g} reached: frames trained on"
            + " | wall time (launch to exit) | env frames/s (whole run) | last minute |")
    rule = "| --- | ---: | " + " | ".join("---:" for _ in bars) + " | ---: | ---: | ---: | ---: |"
    rows = []
    for run, wall in runs:
        cells = []
        for bar in bars:
            hit = learning.reached(run, bar)
            cells.append("not reached" if hit is None else f"{hit[0] / 1e3:,.0f}k, {hit[1]:.0f} s")
        top = learning.first_report(run, bars[-1])
        trained = None if top is None else run.policies[top]["0"]["trained"]
        cells.append("not reached" if top is None else
                     "not recorded" if trained is None else f"{trained / 1e3:,.1f}k")
        rows.append(f"| {run.name} | {at_frames(run, equal):.1f} | " + " | ".join(cells)
                    + f" | {wall:.0f} s | {run.frames[-1] / wall:,.0f} | "
                    f"{learning.last_minute_fps(run):,.0f} |")
    return "\n".join([head, rule, *rows])


def section(env: str) -> str:
    """The heading of ``env``'s section in docs/benchmarks/learning_vs_sf.md."""
    return f"## Learning side by side with Sample Factory: {env}"


def write_docs(env: str, frames: int, seeds: list[int], text: str,
               runs: list[tuple[Progress, float]]) -> None:
    """Rewrite the env's section of docs/benchmarks/learning_vs_sf.md and its two figures."""
    family = FAMILIES[env]
    out = RUNS / env / "plots"
    for path in plot_runs([r for r, _ in runs], out):
        if path.stem in ("reward_vs_frames", "reward_vs_time"):
            suffix = "" if path.stem == "reward_vs_frames" else "_time"
            (DOCS / f"{env}_vs_sf{suffix}.png").write_bytes(path.read_bytes())
    # The flags the first run was given, as Sample Factory saved them.
    config = run_folder(env, "sample_factory", seeds[0]) / "train_dir" / "run" / "config.json"
    flags = " ".join(f for f in json.loads(config.read_text())["command_line"].split()
                     if not f.startswith(("--train_dir", "--seed", "--experiment")))
    write_section(DOC, section(env), (
        f"Command: `python -m bench.learning_vs_sf --env {env} --frames {frames} --seeds "
        f"{','.join(map(str, seeds))} --write-docs` — sfbus trains `sfbus run {family.topology} "
        f"--max-frames {frames}{''.join(' --set ' + x for x in (*family.sets, *SFBUS_REPORTING))} "
        f"--set seed=K`, "
        f"then Sample Factory 2.1.1 (its own venv) "
        f"`python -m {family.sf_module} {flags} --seed=K`, one run after another.\n\n"
        f"Machine: {machine_line(_versions())}. The 2 cores may be shared with other sessions' "
        f"work: wall times and frame rates are noisy, and lower than on an idle machine.\n\n"
        f"Compared on {family.measure} (100-episode mean; `true_reward`, see "
        f"`bench/learning_vs_sf.py`), at the largest env frame count both runs reached, and "
        f"the frames and seconds (from launch) at which the mean first reached each bar.\n\n"
        f"{family.notes}\n\n{text}\n\n"
        f"![{env}: {family.measure} vs env frames, sfbus and Sample Factory]"
        f"({env}_vs_sf.png)\n\n![{env}: {family.measure} vs wall time]({env}_vs_sf_time.png)\n"))


def _versions() -> str:
    """Library versions on both sides, and whether the CPU has bfloat16 instructions."""
    import gymnasium
    import torch

    flags = set(Path("/proc/cpuinfo").read_text().partition("\nflags")[2].split("\n")[0].split())
    bf16 = ", ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags) or "none"
    return (f"torch {torch.__version__}, gymnasium {gymnasium.__version__}; Sample Factory "
            f"2.1.1 with gymnasium 0.29.1, ale-py 0.9.1, mujoco 3.1.6 in its venv; CPU bfloat16 "
            f"instructions: {bf16}")


def main(argv: list[str] | None = None) -> int:
    """Train every (system, seed) not yet trained, print the table, optionally write docs."""
    parser = argparse.ArgumentParser(prog="python -m bench.learning_vs_sf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--frames", type=int, required=True, help="env frames per run")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated, trained in this order (default: both)")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs section")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    systems = [s.strip() for s in args.systems.split(",")]
    if unknown := set(systems) - set(SYSTEMS):
        parser.error(f"unknown system(s) {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    for seed in seeds:
        for system in systems:
            train(args.env, system, seed, args.frames)
    runs = [load(args.env, system, seed) for seed in seeds for system in systems]
    text = table(args.env, runs)
    print("\n" + text)
    if args.write_docs:
        write_docs(args.env, args.frames, seeds, text, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
