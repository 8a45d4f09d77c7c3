"""The Sample Factory checkpoints ``sfbus import-sf``'s tests read, made by Sample Factory itself.

``python -m bench.sf_fixtures`` runs two short Sample Factory 2.1.1 trainings in its own venv
(``bench/sample_factory.py``'s :func:`~bench.sample_factory.ensure_venv`), each on the CPU, in its
serial mode, for :data:`FRAMES` env frames:

- ``doom_basic``: the VizDoom example's model (``convnet_simple`` beside no measurements, a GRU),
  kept small for the repository: 64x36 frames, one FC layer of 64, a GRU of 64;
- ``cartpole``: ``sf_examples.train_gym_env``'s ``CartPole-v1``, an MLP of 32, 32 and no RNN.

Both keep Sample Factory's input and return normalization. Then, still in that venv, Sample
Factory's own model is built from the run's ``config.json`` and its newest checkpoint, an
episode is played from reset, and the first :data:`ROWS` steps are recorded as the reference:
the observations, the RNN state each step was given, and the model's ``action_logits``,
``values`` (in normalized-return space, as the model outputs them), the values denormalized by
the returns normalizer, and ``new_rnn_states``.

Written to ``tests/fixtures/sample_factory/<name>/``: ``config.json``, the one checkpoint in
``checkpoint_p0/`` without its optimizer state (only the model is compared; it halves the file)
and ``reference.pt``. Runs for a minute or two on two cores; nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "sample_factory"
FRAMES = 20_000
"""Env frames each training runs for: enough for a few learner steps, so that the weights and
the normalizers' statistics are no longer their initial ones."""
ROWS = 8
"""Steps of the reference episode recorded."""
_COMMON = ["--device=cpu", "--serial_mode=True", "--num_workers=1", "--num_envs_per_worker=4",
           "--rollout=16", "--batch_size=256", "--decorrelate_experience_max_seconds=0",
           "--with_wandb=False", "--seed=1", f"--train_for_env_steps={FRAMES}",
           "--save_every_sec=3600", "--keep_checkpoints=1"]
CASES: dict[str, list[str]] = {
    "doom_basic": ["--env=doom_basic", "--res_w=64", "--res_h=36",
                   "--encoder_conv_architecture=convnet_simple", "--encoder_conv_mlp_layers",
                   "64", "--use_rnn=True", "--rnn_type=gru", "--rnn_size=64"],
    "cartpole": ["--env=CartPole-v1", "--use_rnn=False", "--encoder_mlp_layers", "32", "32"],
}
"""Sample Factory's flags per fixture (beside ``_COMMON``)."""


def _parse(name: str, flags: list[str]) -> Any:
    """The configuration, parsed as the example script of the env's family parses it."""
    if name == "doom_basic":
        from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_components

        register_vizdoom_components()
        return parse_vizdoom_cfg(flags)
    from sf_examples.train_gym_env import parse_custom_args, register_custom_components

    register_custom_components()
    return parse_custom_args(flags)


def _train(name: str, train_dir: Path) -> Path:
    """Train fixture ``name`` under ``train_dir``; return its experiment folder."""
    from sample_factory.train import run_rl

    flags = [*_COMMON, *CASES[name], f"--train_dir={train_dir}", f"--experiment={name}"]
    status = run_rl(_parse(name, flags))
    if status != 0:
        raise SystemExit(f"{name}: Sample Factory's training ended with status {status}")
    return train_dir / name


def _reference(name: str, experiment: Path) -> dict:
    """Sample Factory's model, loaded from the experiment, on the first steps of an episode."""
    import torch
    from sample_factory.algo.learning.learner import Learner
    from sample_factory.algo.sampling.batched_sampling import preprocess_actions
    from sample_factory.algo.utils.env_info import extract_env_info
    from sample_factory.algo.utils.make_env import make_env_func_batched
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size
    from sample_factory.utils.attr_dict import AttrDict

    flags = [*_COMMON, *CASES[name], f"--train_dir={experiment.parent}",
             f"--experiment={experiment.name}"]
    cfg = _parse(name, flags)
    env = make_env_func_batched(cfg, env_config=AttrDict(worker_index=0, vector_index=0, env_id=0),
                                render_mode=None)
    model = create_actor_critic(cfg, env.observation_space, env.action_space)
    model.eval()
    checkpoints = Learner.get_checkpoints(Learner.checkpoint_dir(cfg, 0), "checkpoint_*")
    model.load_state_dict(Learner.load_checkpoint(checkpoints, "cpu")["model"])
    torch.manual_seed(1)
    obs, _ = env.reset(seed=1)
    rnn = torch.zeros([1, get_rnn_size(cfg)])
    rows: dict[str, list] = {"rnn_states": [], "action_logits": [], "values": [],
                             "values_denormalized": [], "new_rnn_states": []}
    observations: dict[str, list] = {key: [] for key in obs}
    with torch.no_grad():
        for _ in range(ROWS):
            out = model(prepare_and_normalize_obs(model, obs), rnn)
            for key, value in obs.items():
                observations[key].append(value.clone())
            values = out["values"].reshape(1).clone()
            denormalized = values.clone().unsqueeze(1)
            model.returns_normalizer(denormalized, denormalize=True)  # in place
            for key, value in (("rnn_states", rnn), ("action_logits", out["action_logits"]),
                               ("values", values), ("values_denormalized", denormalized[:, 0]),
                               ("new_rnn_states", out["new_rnn_states"])):
                rows[key].append(value.clone())
            rnn = out["new_rnn_states"]
            # as Sample Factory's enjoy hands them over (numpy for a gymnasium env)
            actions = preprocess_actions(extract_env_info(env, cfg), out["actions"].reshape(1, 1))
            obs, _, terminated, truncated, _ = env.step(actions)
            if bool(terminated[0] or truncated[0]):
                rnn = torch.zeros_like(rnn)
    env.close()
    return {"obs": {key: torch.cat(value) for key, value in observations.items()},
            **{key: torch.cat(value) for key, value in rows.items()},
            "sample_factory": "2.1.1"}


def _write(name: str, experiment: Path, reference: dict) -> None:
    """The trimmed experiment and the reference into ``OUT/name``."""
    import torch

    target = OUT / name
    shutil.rmtree(target, ignore_errors=True)
    (target / "checkpoint_p0").mkdir(parents=True)
    shutil.copy(experiment / "config.json", target / "config.json")
    newest = sorted((experiment / "checkpoint_p0").glob("checkpoint_*.pth"))[-1]
    checkpoint = torch.load(newest, map_location="cpu", weights_only=True)
    checkpoint.pop("optimizer", None)
    torch.save(checkpoint, target / "checkpoint_p0" / newest.name)
    torch.save(reference, target / "reference.pt")
    sizes = {p.name: p.stat().st_size for p in target.rglob("*") if p.is_file()}
    print(f"{target}: {json.dumps(sizes)}", flush=True)


def _inside(names: list[str]) -> int:
    """In Sample Factory's venv: train each fixture, record its reference, write it."""
    with tempfile.TemporaryDirectory(prefix="sfbus-sf-fixtures-") as tmp:
        for name in names:
            experiment = _train(name, Path(tmp))
            _write(name, experiment, _reference(name, experiment))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Make the fixtures (all of them, or those named) with Sample Factory in its venv."""
    parser = argparse.ArgumentParser(prog="python -m bench.sf_fixtures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"fixtures to make: {', '.join(CASES)} (default: all)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = args.names or list(CASES)
    if unknown := sorted(set(names) - set(CASES)):
        parser.error(f"unknown fixture(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.inside:
        return _inside(names)
    from bench.sample_factory import ensure_venv

    python = ensure_venv()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in names:  # one process each: the VizDoom example registers its encoder globally
        done = subprocess.run([str(python), "-m", "bench.sf_fixtures", "--inside", name],
                              cwd=ROOT, env=env, check=False)
        if done.returncode:
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
