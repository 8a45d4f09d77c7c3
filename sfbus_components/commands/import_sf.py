"""``sfbus import-sf SF_EXPERIMENT_DIR``: a Sample Factory 2.x experiment as an sfbus run directory.

The experiment's ``config.json`` becomes a topology (the layout ``--topology`` names, by default
``topologies/appo_local_inference.yaml`` for VizDoom and ``topologies/appo.yaml`` otherwise, with
Sample Factory's settings where sfbus has them; the ones it has not are named in one ``note:``
line), and the newest checkpoint of
``--policy`` becomes the policy's first checkpoint (its weights and normalizer statistics,
:mod:`sfbus_components.commands.sf_checkpoint`; Adam's moments start afresh). The run directory
(default ``runs/sf/<experiment>``) then holds what a stopped ``sfbus run`` leaves:
``topology.yaml``, ``checkpoints/policy_<id>/checkpoint_<version>.pt`` and ``run.json``, so that
``enjoy``, ``eval``, ``export`` and ``sfbus run --resume`` (fine-tuning) take it.

Supported: shared weights (Sample Factory's default), images through ``convnet_simple``,
``convnet_atari``, ``convnet_impala`` or ``resnet_impala`` with one FC layer (VizDoom's
measurements beside them), vectors through an MLP, a GRU, a one-layer LSTM or no RNN, discrete
actions (one or several heads); envs ``doom_*`` and gymnasium ids (``gym:<id>`` here). Anything
else is bad input: one ``error:`` line, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from sfbus import BadInput, SfbusError, load_topology, make_private_dir
from sfbus_components.commands.sf_checkpoint import (
    Experiment,
    convert_state,
    model_settings,
    read_experiment,
)

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
DEFAULT_ROOT = Path("runs") / "sf"
_RENAMED = {
    "num_envs_per_worker": "num_envs", "rollout": "rollout", "worker_num_splits": "num_splits",
    "num_batches_to_accumulate": "num_batches_to_accumulate", "reward_scale": "reward_scale",
    "decorrelate_experience_max_seconds": "decorrelate_experience_max_seconds",
    "decorrelate_envs_on_one_worker": "decorrelate_envs_on_one_worker",
    "keep_checkpoints": "keep_checkpoints", "save_every_sec": "checkpoint_every_s",
    "gamma": "appo.gamma", "reward_clip": "appo.reward_clip",
    "value_bootstrap": "appo.value_bootstrap", "normalize_returns": "appo.normalize_returns",
    "exploration_loss_coeff": "appo.entropy_coeff", "exploration_loss": "appo.exploration_loss",
    "value_loss_coeff": "appo.value_loss_coeff", "kl_loss_coeff": "appo.kl_loss_coeff",
    "gae_lambda": "appo.gae_lambda", "ppo_clip_ratio": "appo.ppo_clip_ratio",
    "ppo_clip_value": "appo.ppo_clip_value", "with_vtrace": "appo.with_vtrace",
    "vtrace_rho": "appo.vtrace_rho_bar", "vtrace_c": "appo.vtrace_c_bar",
    "optimizer": "appo.optimizer", "adam_eps": "appo.adam_eps", "adam_beta1": "appo.adam_beta1",
    "adam_beta2": "appo.adam_beta2", "max_grad_norm": "appo.max_grad_norm",
    "learning_rate": "appo.lr", "lr_schedule": "appo.lr_schedule",
    "lr_schedule_kl_threshold": "appo.lr_schedule_kl_threshold",
    "lr_adaptive_min": "appo.lr_adaptive_min", "lr_adaptive_max": "appo.lr_adaptive_max",
    "num_epochs": "appo.num_epochs", "num_batches_per_epoch": "appo.num_batches_per_epoch",
    "shuffle_minibatches": "appo.shuffle_minibatches",
}
"""Sample Factory's setting -> sfbus's, where only the name differs."""
_NOT_IMPORTED: dict[str, Callable[[Any], bool]] = {
    "max_policy_lag": lambda lag: True,  # counted in SGD steps there, in batches here
    "policy_workers_per_policy": lambda workers: workers != 1,
    "eval_env_frameskip": lambda frameskip: frameskip is not None,
    "wide_aspect_ratio": bool,  # sfbus's VizDoom renders 4:3
    "env_gpu_actions": bool,
    "actor_worker_gpus": bool,
}
"""Sample Factory settings with no sfbus setting of the same meaning, and when a value of one
changes what the run does: named in the note line then."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``import-sf`` sub-command (the ``sfbus.commands`` entry point)."""
    parser = subparsers.add_parser(
        "import-sf", help="turn a Sample Factory 2.x experiment into an sfbus run directory",
        description="Read a Sample Factory experiment (config.json and checkpoint_p<N>/) and "
                    "write an sfbus run directory with the same model and weights, which "
                    "enjoy, eval, export and `sfbus run --resume` take.")
    parser.add_argument("experiment", metavar="SF_EXPERIMENT_DIR",
                        help="train_dir/<experiment> of a Sample Factory run")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="where to write it (default: runs/sf/<experiment>)")
    parser.add_argument("--policy", type=int, default=0, metavar="N",
                        help="Sample Factory's policy index (default: 0)")
    parser.add_argument("--topology", metavar="FILE",
                        help="the layout to import into, its settings overridden by the "
                             "experiment's (default: topologies/appo_local_inference.yaml for "
                             "VizDoom, topologies/appo.yaml otherwise)")
    parser.set_defaults(func=cmd_import_sf)


def cmd_import_sf(args: argparse.Namespace) -> int:
    """Run ``sfbus import-sf``; bad input is one ``error:`` line and exit 2, nothing written."""
    folder = Path(args.experiment)
    experiment = read_experiment(folder, args.policy)
    run_dir = Path(args.run_dir) if args.run_dir else DEFAULT_ROOT / folder.resolve().name
    _check_new(run_dir)
    created = not run_dir.exists()
    try:
        version, skipped = write_run_dir(experiment, run_dir, args.topology)
    except BaseException as error:
        _remove(run_dir, created)  # nothing left behind
        if isinstance(error, OSError):  # a full disk, a folder made read-only: exit 1
            raise SfbusError(f"cannot write {run_dir}: {error.strerror or error}") from None
        raise
    print(f"{folder} -> {run_dir}: {experiment.checkpoint.name} as version {version} "
          f"(sfbus enjoy {run_dir}; fine-tune with sfbus run --resume {run_dir})")
    if skipped:
        print(f"note: not imported (no sfbus setting of that meaning): {', '.join(skipped)}",
              file=sys.stderr)
    return 0


def write_run_dir(experiment: Experiment, run_dir: Path,
                  topology: str | None = None) -> tuple[int, list[str]]:
    """Write the run directory of ``experiment``, its layout ``topology`` (None: the default
    for its env); returns the checkpoint's version and the names of Sample Factory's settings
    that were not imported."""
    from sfbus_components.commands.enjoy import learner_params
    from sfbus_components.learning.checkpoint import config_fingerprint, save_checkpoint

    config = experiment.config
    env = sfbus_env(config["env"])
    spec = _env_spec(env, _env_kwargs(env, config))
    image = {k for k, f in spec.observation_space.items() if len(f.shape) == 3}
    if not spec.action_heads or spec.box_size:
        raise BadInput(f"{experiment.folder}: env {config['env']}: only discrete actions are "
                       "imported")
    model = model_settings(config, bool(image), "measurements" in spec.observation_space)
    document = _topology(env, config, model, _base_topology(env, topology))
    make_private_dir(run_dir)
    snapshot = run_dir / "topology.yaml"
    snapshot.write_text(yaml.safe_dump(document, sort_keys=False))
    params = learner_params(run_dir, None)
    state = _training_state(experiment, spec, params, image)
    fingerprint = config_fingerprint(params.data.env, params.data.model)
    path = save_checkpoint(run_dir / "checkpoints" / f"policy_{params.policy}",
                           {**state, "config": fingerprint}, state["version"], keep=1)
    # `sfbus run --resume` takes a directory with a run's manifest; the resumed run writes its
    # own over this placeholder (which names no shared arrays: none exist yet)
    (run_dir / "run.json").write_text(json.dumps(
        {"run_id": f"import-sf-{run_dir.name}", "sock_dir": "", "topology_file": str(snapshot),
         "arrays": []}))
    skipped = [f"{key}={config[key]}" for key, matters in _NOT_IMPORTED.items()
               if key in config and matters(config[key])]
    return int(path.stem.rsplit("_", 1)[1]), skipped


def sfbus_env(name: str) -> str:
    """sfbus's name of Sample Factory's env ``name``: VizDoom's ``doom_*`` keep theirs, a
    gymnasium id becomes ``gym:<id>``."""
    if name.startswith("doom_"):
        return name
    import gymnasium

    if name in gymnasium.envs.registry:
        return f"gym:{name}"
    raise BadInput(f"config.json: env {name!r} is not imported (VizDoom's doom_* envs and "
                   "gymnasium ids are)")


def _env_kwargs(env: str, config: dict[str, Any]) -> dict[str, Any]:
    """The env factory's arguments Sample Factory's VizDoom flags give."""
    if not env.startswith("doom_"):
        return {}
    return {"frameskip": int(config.get("env_frameskip", 4)),
            "resolution": [int(config.get("res_w", 128)), int(config.get("res_h", 72))]}


def _env_spec(env: str, kwargs: dict[str, Any]) -> Any:
    """The env's spec (made once to read its spaces); an env that cannot be made is bad input."""
    from sfbus_components.envs import env_spec

    try:
        return env_spec(env, **kwargs)
    except Exception as error:  # an env's constructor raises anything
        raise BadInput(f"config.json: env {env} cannot be made here: "
                       f"{type(error).__name__}: {error}") from None


def _base_topology(env: str, given: str | None) -> Path:
    """The topology file the import extends: ``given``, or the default for ``env`` from the
    source tree's ``topologies/`` (a wheel has none: then ``--topology`` is needed)."""
    if given is not None:
        if not Path(given).is_file():
            raise BadInput(f"--topology {given}: no such file")
        return Path(given).resolve()
    default = TOPOLOGIES / ("appo_local_inference.yaml" if env.startswith("doom_") else
                            "appo.yaml")
    if not default.is_file():
        raise BadInput(f"{default}: not found (sfbus installed without its topologies/); give "
                       "the layout to import into with --topology FILE")
    return default


def _topology(env: str, config: dict[str, Any], model: dict[str, Any],
              base: Path) -> dict[str, Any]:
    """The merged topology document of the imported run (what ``sfbus run`` snapshots): ``base``
    with the experiment's settings."""
    settings: dict[str, Any] = {"env": env, "model": model}
    if kwargs := _env_kwargs(env, config):
        settings["env_kwargs"] = kwargs
    for theirs, ours in _RENAMED.items():
        if config.get(theirs) is not None:
            _put(settings, ours, config[theirs])
    if config.get("batched_sampling"):
        settings["sampling"] = "batched"
    settings["batch_size"] = int(config.get("batch_size", 1024)) * int(
        config.get("num_batches_per_epoch", 1))
    recurrence = int(config.get("recurrence", -1))
    if model["core"] != "none" and recurrence not in (-1, int(config.get("rollout", 32))):
        _put(settings, "appo.recurrence", recurrence)
    # Sample Factory's seed, or one drawn now as `sfbus run` draws one, kept in the run
    seed = config.get("seed")
    settings["seed"] = int(seed) if seed is not None else secrets.randbits(32)
    name = f"sf_{config.get('experiment', 'experiment')}"
    processes = {"rollout": {"replicas": int(config.get("num_workers", 1))}}
    with tempfile.TemporaryDirectory(prefix="sfbus-import-sf-") as tmp:
        file = Path(tmp) / "topology.yaml"
        document = {"name": name, "extends": str(base), "settings": settings,
                    "processes": processes}
        file.write_text(yaml.safe_dump(document, sort_keys=False))
        return load_topology(str(file)).document


def _put(settings: dict[str, Any], dotted: str, value: Any) -> None:
    """``settings[a][b] = value`` for ``dotted`` ``a.b``."""
    *path, last = dotted.split(".")
    for key in path:
        settings = settings.setdefault(key, {})
    settings[last] = value


def _training_state(experiment: Experiment, spec: Any, params: Any,
                    image_keys: set[str]) -> dict[str, Any]:
    """The learner's state of the imported policy: weights and statistics from the checkpoint,
    fresh Adam moments, Sample Factory's counters."""
    from sfbus_components.learning.training_state import TrainingState
    from sfbus_components.models.policy import Policy

    policy = Policy(spec, params.data.model)
    weights, returns = convert_state(experiment.state["model"], policy.state_dict(), image_keys,
                                     experiment.checkpoint)
    policy.load_state_dict(weights)
    training = TrainingState(policy, params.learner.appo, seed=params.data.seed)
    if training.returns_normalizer is not None and returns is not None:
        training.returns_normalizer.load_state_dict(returns)
    train_steps = int(experiment.state.get("train_step", 0))
    training.version = train_steps + 1  # sfbus's first weights are version 1
    training.train_steps = train_steps
    training.env_frames = int(experiment.state.get("env_steps", 0))
    training.samples = training.env_frames // max(1, params.data.env_kwargs.get("frameskip", 1))
    return training.state_dict()


def _check_new(run_dir: Path) -> None:
    """Refuse a run directory that holds anything (an import never mixes with other files)."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise BadInput(f"--run-dir {run_dir}: exists and is not an empty directory; choose a "
                       "new one")


def _remove(run_dir: Path, created: bool) -> None:
    """Undo a failed import: the directory if it made it, else what it wrote into it."""
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif run_dir.is_dir():
        for entry in run_dir.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
