"""Sample Factory 2.1.1 on this machine, measured the way ``bench/throughput.py`` measures sfbus.

Sample Factory is installed into its own virtual environment, ``bench/.venvs/sample-factory``
(:func:`ensure_venv`), never into sfbus's. Each case runs this module again inside that venv
(``--inside train`` or ``--inside sample``), in a fresh session of processes:

- *full training* (:func:`run_training`) is exactly what ``python -m
  sf_examples.vizdoom.train_vizdoom FLAGS`` does (register the VizDoom envs and encoder, parse,
  ``run_rl``; for ``atari_*`` and ``mujoco_*`` envs ``train_atari``'s and ``train_mujoco``'s
  registration and parsing instead, as ``bench/learning_vs_sf.py`` uses), plus a handler beside
  the runner's own for the learner's env-step reports, which appends (time, env frames, the
  100-episode means) to ``progress.jsonl`` at every training iteration;
- *the sampler alone* (:func:`run_sampler`) is Sample Factory's own sampling-without-learning API,
  ``sample_factory.algo.sampling.simplified_sampling_api.SamplingLoop`` (the engine behind its
  ``SyncSamplingAPI`` and ``sf_examples/sampler``): the same rollout workers and inference worker
  as in training, serving the same model at its initial weights, with no learner. Each finished
  trajectory's buffer is handed straight back, as sfbus's ``TrajectorySink`` does
  (``SyncSamplingAPI`` would also clone every trajectory in the main process first, a cost that is
  neither sampling nor learning).

Both take the same flags (:func:`sf_flags`): ``--device=cpu``, the default ``convnet_simple``
encoder and a GRU of 512, rollout 32, batch 1024, ``--worker_num_splits=2``, parallel (not
serial) mode, no decorrelation of the envs at start. Sample Factory pins rollout worker i to core
i itself (``--set_workers_cpu_affinity``, on by default).

A rate is env frames (agent steps x frameskip) over a window that starts ``warmup`` seconds after
the first frames, read from ``progress.jsonl`` as the sfbus cases read theirs; the process tree
is sampled from ``/proc`` at the window's ends with ``bench.throughput_topologies.measure``, its
groups named after Sample Factory's processes: ``runner`` (the main process: the runner, or the
sampling loop), ``learner``, ``inference``, ``rollout.i`` and ``rollout.i vizdoom`` (its engines).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import venv
from pathlib import Path
from typing import Any

# Also imported inside Sample Factory's venv, which has its dependency yaml (via huggingface-hub).
from bench import throughput_topologies as tt

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".venvs" / "sample-factory"
# Installed in this order. torch first and pinned: this is the CPU build that lies on local disk;
# sample-factory's own "torch<3" would otherwise pull a multi-GB CUDA build. sample-factory 2.1.1
# caps numpy<2 and gymnasium<1 itself, so pip settles on numpy 1.26 and gymnasium 0.29, which run
# with Python 3.11 and torch 2.13: nothing else needs pinning. Its VizDoom extra only adds pygame,
# for rendering, which the benchmark never does.
# The learning comparison (bench/learning_vs_sf.py) adds Atari and MuJoCo: ale-py 0.9 is the last
# with its ROMs in the wheel that still accepts gymnasium 0.29 (0.10 needs gymnasium 1), and
# mujoco 3.1 runs gymnasium 0.29's v4 envs, whose renderer module imports imageio.
REQUIREMENTS = (("torch==2.13.0",), ("sample-factory==2.1.1", "vizdoom==1.3.2", "ale-py==0.9.1",
                                     "mujoco==3.1.6", "imageio"))
_MARKER = VENV / "bench-requirements.txt"
PROGRESS_INTERVAL_S = 0.1  # as sfbus's stats actor reports in the bench
STOP_S = 60.0  # Sample Factory saves a checkpoint and closes every env on Ctrl-C


# ----- the venv -----------------------------------------------------------------------------

def ensure_venv() -> Path:
    """Create Sample Factory's venv unless it is already there; return its Python.

    ``SFBUS_BENCH_SF_PYTHON`` names a Python that already runs Sample Factory instead (a machine
    with no package index, such as a lent GPU machine with wheels carried to it)."""
    if given := os.environ.get("SFBUS_BENCH_SF_PYTHON"):
        return Path(given)
    python = VENV / "bin" / "python"
    wanted = "\n".join(" ".join(step) for step in REQUIREMENTS) + "\n"
    if python.exists() and _MARKER.exists() and _MARKER.read_text() == wanted:
        return python
    print(f"sample-factory venv: creating {VENV}", flush=True)
    venv.EnvBuilder(clear=True, with_pip=True).create(VENV)
    for step in REQUIREMENTS:
        print(f"sample-factory venv: pip install {' '.join(step)}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *step], check=True)
    _MARKER.write_text(wanted)  # last, so that an interrupted install is redone
    return python


def sf_flags(env: str, workers: int, envs: int, train_dir: Path, rollout: int = 32,
             batch_size: int = 1024, device: str = "cpu") -> list[str]:
    """Sample Factory's command-line flags for the configuration the sfbus cases run
    (``device``: ``cpu`` or ``gpu``)."""
    return [f"--env={env}", f"--device={device}", f"--num_workers={workers}",
            f"--num_envs_per_worker={envs}", f"--rollout={rollout}", f"--batch_size={batch_size}",
            "--worker_num_splits=2", "--serial_mode=False",
            "--encoder_conv_architecture=convnet_simple", "--use_rnn=True", "--rnn_type=gru",
            "--rnn_size=512",
            # Decorrelation only delays the first frames by stepping every env at random first.
            "--decorrelate_envs_on_one_worker=False", "--decorrelate_experience_max_seconds=0",
            "--with_wandb=False", f"--train_dir={train_dir}", "--experiment=bench"]


# ----- measuring a case ---------------------------------------------------------------------

def run_training(seconds: float, warmup: float, env: str = "doom_basic", workers: int = 2,
                 envs: int = 16, device: str = "cpu",
                 extra_flags: tuple[str, ...] = ()) -> tt.Window:
    """Sample Factory's full training, measured over ``seconds`` after ``warmup``;
    ``extra_flags`` come after (and so override) :func:`sf_flags`'."""
    return _measure("train", seconds, warmup, env, workers, envs, device, extra_flags)


def run_sampler(seconds: float, warmup: float, env: str = "doom_basic", workers: int = 2,
                envs: int = 16, device: str = "cpu") -> tt.Window:
    """Sample Factory's sampler alone (rollout + inference, no learner), measured."""
    return _measure("sample", seconds, warmup, env, workers, envs, device)


def _measure(mode: str, seconds: float, warmup: float, env: str, workers: int,
             envs: int, device: str, extra_flags: tuple[str, ...] = ()) -> tt.Window:
    """Run this module inside the venv in ``mode`` and measure it as ``run_sfbus`` does."""
    python = ensure_venv()
    with tempfile.TemporaryDirectory(prefix="sfbus-bench-sf-") as name:
        tmp = Path(name)
        log = tmp / "output.txt"
        limit = 300 + warmup + seconds
        # a flag given twice keeps its first place and its last value
        given = (*sf_flags(env, workers, envs, tmp / "train_dir", device=device), *extra_flags)
        flags = list({f.split("=", 1)[0]: f for f in given}.values())
        command = [str(python), "-m", "bench.sample_factory", "--inside", mode, "--folder",
                   str(tmp), "--", *flags]
        started = time.monotonic()
        with log.open("wb") as out:
            # Its own session: Ctrl-C goes to the whole tree, and nothing is left behind.
            proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            progress = tt.ProgressTail(tmp / "progress.jsonl", proc, log, timeout=limit)
            first = progress.until(lambda r: r[1] > 0)
            startup = time.monotonic() - started
            window = tt.measure(_roots(proc.pid, tmp / "processes.json"), lambda: first,
                                lambda t: progress.until(lambda r: r[0] >= t), warmup, seconds)
            window.startup_s = startup
            window.extra["flags"] = " ".join(f for f in flags if not f.startswith("--train_dir"))
            return window
        finally:
            _stop(proc)


def _roots(main: int, names: Path) -> dict[int, str]:
    """Sample Factory's processes by group name, its main process ``runner``."""
    workers = {int(pid): _group(name) for pid, name in json.loads(names.read_text()).items()}
    return {**workers, main: "runner"}


def _group(process: str) -> str:
    """``rollout_proc1`` -> ``rollout.1``, ``learner_proc0`` -> ``learner``,
    ``inference_proc0-0`` -> ``inference``."""
    kind, _, index = process.partition("_proc")
    return f"{kind}.{index}" if kind == "rollout" else kind


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C to the whole session, as a user stops Sample Factory; after ``STOP_S``, SIGKILL to
    whatever of it is left, and removal of the shared memory it had mapped (killed VizDoom engines
    leave theirs in /dev/shm)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_S)
    left = _shared_memory(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for path in left:
        path.unlink(missing_ok=True)


def _shared_memory(group: int) -> set[Path]:
    """Files in /dev/shm that the processes of process group ``group`` have mapped."""
    found: set[Path] = set()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError):  # not a process, or it exited meanwhile
            if os.getpgid(int(entry)) == group:
                for line in Path(f"/proc/{entry}/maps").read_text().splitlines():
                    if " /dev/shm/" in line and not line.endswith("(deleted)"):
                        found.add(Path(line[line.index(" /dev/shm/") + 1:]))
    return found


# ----- inside Sample Factory's venv ---------------------------------------------------------

class _ProgressLog:
    """Appends ``{"time", "env_frames", "policies"}`` records to ``progress.jsonl``, at most one per
    ``PROGRESS_INTERVAL_S``; names the worker processes in ``processes.json`` before the first
    frames are recorded (all of them have started by then). ``policies`` holds policy 0's
    episode means as sfbus's stats actor names them (:func:`_episode_means`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.file = (folder / "progress.jsonl").open("a")
        self.last = 0.0

    def update(self, frames: int, policies: dict[str, dict[str, float]] | None = None) -> None:
        """Record ``frames`` (env frames so far) now, unless the last record is too recent."""
        now = time.time()
        if frames <= 0 or now - self.last < PROGRESS_INTERVAL_S:
            return
        if not self.last:
            names = {p.pid: p.name for p in multiprocessing.active_children()}
            (self.folder / "processes.json").write_text(json.dumps(names))
        self.last = now
        record = {"time": now, "env_frames": frames, "policies": policies or {}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


def _episode_means(runner: Any) -> dict[str, dict[str, float]]:
    """Policy 0's means over the runner's last ``stats_avg`` (100) episodes, in sfbus's names:
    ``reward`` is Sample Factory's episode reward (for Atari: one life, clipped), ``true_reward``
    the whole game's raw score where ``RecordEpisodeStatistics`` reports it (Atari), else
    its ``true_objective``."""
    stats = runner.policy_avg_stats
    means = {}
    for ours, theirs in (("reward", ("reward",)),
                         ("true_reward", ("RecordEpisodeStatistics_reward", "true_objective"))):
        found = next((stats[k][0] for k in theirs if k in stats and len(stats[k][0])), None)
        if found is not None:
            means[ours] = float(sum(found) / len(found))
    return {"0": means} if means else {}


def _config(flags: list[str]) -> Any:
    """Sample Factory's configuration, parsed as its example script for the env's family
    (``train_vizdoom``, ``train_atari`` or ``train_mujoco``) parses it."""
    env = next((f.split("=", 1)[1] for f in flags if f.startswith("--env=")), "")
    if env.startswith("atari_"):
        from sample_factory.envs.env_utils import register_env
        from sf_examples.atari.atari_utils import ATARI_ENVS
        from sf_examples.atari.train_atari import parse_atari_args

        for spec in ATARI_ENVS:  # as register_atari_components, through _make_atari_env
            register_env(spec.name, _make_atari_env)
        return parse_atari_args(flags)
    if env.startswith("mujoco_"):
        from sf_examples.mujoco.train_mujoco import parse_mujoco_cfg, register_mujoco_components

        register_mujoco_components()
        return parse_mujoco_cfg(flags)
    from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_components

    register_vizdoom_components()
    return parse_vizdoom_cfg(flags)


def _make_atari_env(*args: Any, **kwargs: Any) -> Any:
    """``make_atari_env`` once ale-py's ids are registered: ale-py 0.9 registers them with
    gymnasium 0.29 on import, not through the entry point ale-py 0.8 had."""
    import ale_py  # noqa: F401
    from sf_examples.atari.atari_utils import make_atari_env

    return make_atari_env(*args, **kwargs)


def _check_numpy() -> None:
    """Refuse numpy 2, which Sample Factory 2.1.1 caps itself below: with it every rollout
    worker dies at its first action (``set_trajectory_data``: "setting an array element with a
    sequence") while the runner goes on reporting no frames until the bench's time limit."""
    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:
        raise SystemExit(f"Sample Factory 2.1.1 needs numpy<2 (its own requirement); "
                         f"{sys.executable} has numpy {numpy.__version__}")


_PATCHED_ENV = "SFBUS_BENCH_SF_SKIP_MISSING_ADVANTAGES"


def _skip_missing_advantage_summaries() -> None:
    """Sample Factory 2.1.1's learner records statistics of the advantages, which only its GAE
    path computes: with V-trace its first summary raises (AttributeError: no 'advantages') and
    the run stops with no frames. Upstream fixed it after 2.1.1 (sample-factory #286, #332) by
    skipping them where there are none; this does the same from outside, in every process: its
    learner runs in a spawned process, which runs this module again as ``__mp_main__``."""
    from sample_factory.algo.learning.learner import Learner

    record = Learner._record_summaries

    def record_without_missing(self: Any, var: Any) -> Any:
        if "advantages" in var.mb:
            return record(self, var)
        var.mb["advantages"] = var.mb.valids.float()  # a stand-in, its figures dropped below
        var["adv_std"] = var["adv_mean"] = math.nan
        stats = record(self, var)
        for key in ("adv_min", "adv_max", "adv_std", "adv_mean"):
            stats.pop(key, None)
        return stats

    Learner._record_summaries = record_without_missing


def _train_inside(flags: list[str], progress: _ProgressLog) -> int:
    """``train_vizdoom``'s ``run_rl``, reporting the learner's env frames as they grow."""
    from sample_factory.algo.utils.misc import LEARNER_ENV_STEPS, ExperimentStatus
    from sample_factory.train import make_runner

    _skip_missing_advantage_summaries()
    os.environ[_PATCHED_ENV] = "1"  # inherited by the spawned learner (module end)
    _, runner = make_runner(_config(flags))
    # Appended after the runner's own handler, which has updated ``env_steps`` by then.
    runner.policy_msg_handlers[LEARNER_ENV_STEPS].append(
        lambda r, _msg, _policy: progress.update(sum(r.env_steps.values()), _episode_means(r)))
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    return int(status)


def _sample_inside(flags: list[str], progress: _ProgressLog) -> int:
    """Sample Factory's ``SamplingLoop`` with every trajectory handed straight back, until
    Ctrl-C."""
    from sample_factory.algo.sampling.simplified_sampling_api import SamplingLoop
    from sample_factory.algo.utils.env_info import obtain_env_info_in_a_separate_process
    from sample_factory.algo.utils.rl_utils import samples_per_trajectory

    cfg = _config(flags)
    loop = SamplingLoop(cfg, obtain_env_info_in_a_separate_process(cfg))
    loop.init()
    frames = 0

    def on_trajectory(trajectory: Any, buffers: list[Any], device: str) -> None:
        nonlocal frames
        frames += samples_per_trajectory(trajectory) * cfg.env_frameskip
        loop.yield_trajectory_buffers(buffers, device)
        progress.update(frames)

    loop.set_new_trajectory_callback(on_trajectory)
    thread = threading.Thread(target=loop.run, name="sampling-loop")
    thread.start()
    try:
        loop.wait_until_ready()
        loop.start()  # no model data: the inference worker serves its initial weights
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        loop.stop_sampling()
        thread.join()
    return 0


# ----- command line -------------------------------------------------------------------------

def _describe(title: str, w: tt.Window) -> str:
    groups = "\n".join(f"    {name:<28} {share:5.2f} cores" + (f" ({n} processes)" if n > 1 else "")
                       for name, (share, n) in sorted(w.cpu.items()))
    return (f"{title}: {w.rate:,.0f} env frames/s over {w.seconds:.1f} s (start-up "
            f"{w.startup_s:.1f} s); {w.cores:.2f} cores, others {w.others:.2f}; RSS "
            f"{w.rss / 2**30:.2f} GiB, PSS {w.pss / 2**30:.2f} GiB\n{groups}")


def main(argv: list[str] | None = None) -> int:
    """Measure Sample Factory's sampler alone and its full training, and print both."""
    parser = argparse.ArgumentParser(prog="python -m bench.sample_factory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per case")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after first frames")
    parser.add_argument("--workers", type=int, default=2, help="rollout workers")
    parser.add_argument("--envs", type=int, default=16, help="envs per worker")
    parser.add_argument("--env", default="doom_basic", help="Sample Factory env name")
    parser.add_argument("--cases", default="sample,train", help="comma-separated: sample, train")
    # Internal: this module run again inside Sample Factory's venv, with its flags after "--".
    parser.add_argument("--inside", choices=("train", "sample"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("flags", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        _check_numpy()
        # Ctrl-C must reach Sample Factory's handlers even when a shell that started us in the
        # background handed SIGINT down ignored (Python then installs no handler of its own).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        run = _train_inside if args.inside == "train" else _sample_inside
        return run(args.flags, _ProgressLog(args.folder))
    cases = {"sample": ("Sample Factory, sampler alone", run_sampler),
             "train": ("Sample Factory, full training", run_training)}
    for key in (k.strip() for k in args.cases.split(",") if k.strip()):
        if key not in cases:
            parser.error(f"unknown case {key!r}; known: {', '.join(cases)}")
        title, run_case = cases[key]
        window = run_case(args.seconds, args.warmup, args.env, args.workers, args.envs)
        print(_describe(title, window), flush=True)
    return 0


if __name__ == "__mp_main__" and os.environ.get(_PATCHED_ENV):
    _skip_missing_advantage_summaries()
if __name__ == "__main__":
    sys.exit(main())
