"""``sfbus push RUN_DIR --repo user/name``: a trained policy as a Hugging Face Hub model.

Builds the model folder (:mod:`sfbus_components.commands.hub` has its layout) from one policy of
the run: the checkpoint (the run's best when it has one, else its newest, or ``--checkpoint``),
the run's topology snapshot, a model card (``README.md``) and ``sfbus.json``, and with
``--video`` one episode filmed as ``sfbus enjoy --video`` films it. The card's reward is the mean
return of ``--episodes`` seeded episodes played now by ``sfbus eval``'s loop, so it is the
pushed checkpoint's own. Then ``HfApi().upload_folder`` uploads the folder, unless
``--no-upload`` (the folder stays in ``--local-dir``, default ``RUN_DIR/hub``, either way).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

import yaml

from sfbus import BadInput, SfbusError
from sfbus_components.commands.enjoy import (
    EnjoyError,
    VideoWriter,
    agents_players,
    frame_source,
    learner_params,
    learners,
    make_play_env,
    play,
    read_checkpoint,
)
from sfbus_components.commands.evaluate import evaluate
from sfbus_components.commands.hub import MODEL_INFO, VIDEO, check_repo_id, import_hub
from sfbus_components.commands.outputs import check_writable_dir

_VIDEO_MAX_STEPS = 2000  # one episode filmed; an env that never ends one still gives a video


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``push`` sub-command (the ``sfbus.commands`` entry point)."""
    parser = subparsers.add_parser(
        "push", help="upload a trained policy to the Hugging Face Hub",
        description="Write a policy of a run as a Hub model folder (model card, topology, "
                    "checkpoint, optional video) and upload it with huggingface_hub.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory of `sfbus run`")
    parser.add_argument("--repo", required=True, metavar="user/name",
                        help="the Hub repository (made when missing)")
    parser.add_argument("--local-dir", metavar="DIR",
                        help="where to build the folder (default: RUN_DIR/hub)")
    parser.add_argument("--no-upload", action="store_true",
                        help="build the folder only")
    parser.add_argument("--video", action="store_true",
                        help=f"film one episode into {VIDEO}")
    parser.add_argument("--policy", type=int, default=None, metavar="N",
                        help="policy id (default: the run's only policy)")
    parser.add_argument("--checkpoint", metavar="PATH|best",
                        help="checkpoint file, or 'best' (default: the best, else the newest)")
    parser.add_argument("--episodes", type=int, default=10, metavar="N",
                        help="seeded episodes the card's mean reward is played over (default: 10)")
    parser.set_defaults(func=cmd_push)


def cmd_push(args: argparse.Namespace) -> int:
    """Run ``sfbus push``: bad input is one ``error:`` line and exit 2, a failed upload exit 1."""
    hub = None if args.no_upload else import_hub()  # missing: refused before any work
    repo = check_repo_id(args.repo, "--repo")
    run_dir = Path(args.run_dir)
    folder = Path(args.local_dir) if args.local_dir else run_dir / "hub"
    try:
        if args.episodes < 1:
            raise EnjoyError(f"--episodes must be >= 1, not {args.episodes}")
        params = learner_params(run_dir, args.policy)
        path, state = _checkpoint(run_dir, params, args.checkpoint)
        beside = _beside(run_dir, params)
    except EnjoyError as error:
        raise BadInput(str(error)) from None
    if folder.resolve() in (run_dir.resolve(), *run_dir.resolve().parents):
        raise BadInput(f"--local-dir {folder}: holds the run itself; choose a folder of its own")
    _prepare_folder(folder)
    try:
        info = _build_folder(folder, run_dir, repo, params, (path, state, beside), args)
    except BaseException:  # a half-built folder must not be uploaded by a later push
        shutil.rmtree(folder, ignore_errors=True)
        raise
    print(f"policy {params.policy} of {run_dir}: {path.name} (version {state['version']}, "
          f"{state['env_frames']:,} env frames), mean reward {info['mean_reward']:.2f} +/- "
          f"{info['std_reward']:.2f} over {info['episodes']} episodes -> {folder}")
    if hub is None:
        print(f"not uploaded (--no-upload); upload later with sfbus push {run_dir} --repo {repo}")
        return 0
    return _upload(hub, repo, folder, run_dir)


def _build_folder(folder: Path, run_dir: Path, repo: str, params: Any,
                  checkpoints: tuple[Path, dict, dict[str, str]],
                  args: argparse.Namespace) -> dict[str, Any]:
    """Write the model folder from the policy's checkpoint (its path and state) and those it
    plays beside (:func:`_beside`); returns its :data:`MODEL_INFO`."""
    path, state, beside = checkpoints
    rows = evaluate(params, state, run_dir, episodes=args.episodes, envs=min(4, args.episodes),
                    deterministic=False, first_seed=0)
    returns = [r.episode_return for r in rows]
    info = {
        "repo": repo, "env": params.data.env, "policy": params.policy,
        "checkpoint": f"checkpoints/policy_{params.policy}/{path.name}",
        "version": state["version"], "env_frames": state["env_frames"], "seed": params.data.seed,
        "max_frames": _max_frames(run_dir, state["env_frames"]),
        "mean_reward": statistics.fmean(returns),
        "std_reward": statistics.pstdev(returns), "episodes": len(rows),
        "training_reward": _training_reward(run_dir, params.policy),
        "beside": beside,
    }
    shutil.copyfile(run_dir / "topology.yaml", folder / "topology.yaml")
    for source, copy in ((path, info["checkpoint"]), *(
            (run_dir / name, name) for name in info["beside"].values())):
        (folder / copy).parent.mkdir(parents=True)
        shutil.copyfile(source, folder / copy)
    if args.video:
        _film(run_dir, params, state, folder / VIDEO)
    (folder / MODEL_INFO).write_text(json.dumps(info, indent=2) + "\n")
    (folder / "README.md").write_text(model_card(info, video=args.video))
    return info


def _beside(run_dir: Path, params: Any) -> dict[str, str]:
    """In a run of heterogeneous agents, the newest checkpoint of every other policy (by id, a
    path in the run), which plays the other agents wherever this one is played; else none."""
    if not params.data.agent_policies:
        return {}
    found = {}
    for other, trained in learners(run_dir).items():
        if other != params.policy:
            path, _ = read_checkpoint(run_dir, trained, None)
            found[str(other)] = str(path.relative_to(run_dir))
    return found


def _checkpoint(run_dir: Path, params: Any, checkpoint: str | None) -> tuple[Path, dict]:
    """The checkpoint to push: ``checkpoint`` as enjoy reads it, or the best when there is one,
    else the newest."""
    if checkpoint is None and any((run_dir / "checkpoints" / f"policy_{params.policy}" / "best")
                                  .glob("checkpoint_*.pt")):
        checkpoint = "best"
    return read_checkpoint(run_dir, params, checkpoint)


def _prepare_folder(folder: Path) -> None:
    """``folder`` new or empty, or an earlier push's (emptied): any other folder is refused."""
    if folder.is_dir() and any(folder.iterdir()):
        if not (folder / MODEL_INFO).is_file():
            raise BadInput(f"--local-dir {folder}: the directory is not empty and holds no "
                           "earlier push; choose a new or empty directory")
        shutil.rmtree(folder)  # every file of the folder is uploaded: no stale one may stay
    check_writable_dir(folder, "--local-dir", "the model folder")


def _max_frames(run_dir: Path, trained: int) -> int:
    """The run's ``--max-frames`` (its limits as ``run.json`` records them, ``RunLimits``), else
    the frames the checkpoint trained on."""
    try:
        limits = json.loads((run_dir / "run.json").read_text())["limits"]
        return int(limits["max_frames"] or trained)
    except (OSError, ValueError, KeyError, TypeError):  # no run.json (a copied run)
        return trained


def _training_reward(run_dir: Path, policy: int) -> float | None:
    """The run's last reported mean reward of ``policy`` (``progress.jsonl``), if any."""
    try:
        lines = (run_dir / "progress.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)["policies"][str(policy)]
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a kill, or one before this policy reported
        if record.get("episodes"):
            return float(record["reward"])
    return None


def _film(run_dir: Path, params: Any, state: dict, video: Path) -> None:
    """One episode of the checkpoint ``state`` into ``video``, as ``sfbus enjoy --video``."""
    env = make_play_env(params, render=True)
    try:
        render, fps = frame_source(env, params.data.env)
        writer = VideoWriter(video, fps, render)
        try:
            players, counted = agents_players(run_dir, params, state, env.spec)
            play(players, counted, params.data.state_size, env, 1, max_steps=_VIDEO_MAX_STEPS,
                 seed=0, on_frame=writer.append)
        finally:
            writer.close()
    except EnjoyError as error:
        raise BadInput(str(error)) from None
    finally:
        env.close()


def model_card(info: dict[str, Any], *, video: bool) -> str:
    """The model card: YAML front matter as the Hub reads it, then what the model is and how to
    play, score and retrain it."""
    reward = f"{info['mean_reward']:.2f} +/- {info['std_reward']:.2f}"
    meta = {
        "library_name": "sfbus",
        "tags": ["reinforcement-learning", "deep-reinforcement-learning", "sfbus", "appo",
                 info["env"]],
        "model-index": [{"name": "APPO", "results": [{
            "task": {"type": "reinforcement-learning", "name": "reinforcement-learning"},
            "dataset": {"name": info["env"], "type": info["env"]},
            "metrics": [{"type": "mean_reward", "value": reward, "name": "mean_reward",
                         "verified": False}],
        }]}],
    }
    repo, checkpoint = info["repo"], info["checkpoint"]
    training = ("" if info["training_reward"] is None or math.isnan(info["training_reward"])
                else f" The run last reported a mean reward of {info['training_reward']:.2f} "
                     "over its recent episodes.")
    lines = [
        "---", yaml.safe_dump(meta, sort_keys=False).rstrip(), "---", "",
        f"# APPO on {info['env']} (sfbus)", "",
        f"Policy {info['policy']} of an sfbus run: an asynchronous PPO "
        f"agent trained on `{info['env']}` for {info['env_frames']:,} env frames (version "
        f"{info['version']}, `{checkpoint}`).", "",
        *(["Its agents play beside the run's other agents, of other spaces, which act with "
           "their own policies: " + ", ".join(f"policy {p} (`{name}`)" for p, name in
                                               info["beside"].items()) +
           ", included here; `sfbus enjoy` and `sfbus eval` play them.", ""]
          if info.get("beside") else []),
        f"Mean reward: **{reward}** over {info['episodes']} episodes (seeds 0 to "
        f"{info['episodes'] - 1}, sampled actions, as `sfbus eval --episodes "
        f"{info['episodes']}` plays them).{training}", "",
        *([f"![one episode]({VIDEO})", ""] if video else []),
        "## Use it", "",
        "```sh", "pip install 'sfbus[tools]'",
        f"sfbus enjoy hub:{repo}                     # watch it play",
        f"sfbus eval hub:{repo} --episodes 100       # score it into CSV",
        f"sfbus pull {repo} --run-dir runs/{repo.split('/')[1]}   # the run directory itself",
        "```", "",
        "## Train it again", "",
        "`topology.yaml` is the run's own topology with every setting it trained with. This "
        "command trains the same settings from the same seed (asynchronous sampling makes a "
        "rerun alike, not identical):", "",
        "```sh",
        f"sfbus run topology.yaml --seed {info['seed']} --max-frames {info['max_frames']}",
        "```", "",
    ]
    return "\n".join(lines)


def _upload(hub: Any, repo: str, folder: Path, run_dir: Path) -> int:
    """Create ``repo`` when missing and upload ``folder`` to it; a failure is exit 1."""
    try:
        api = hub.HfApi()
        api.create_repo(repo, repo_type="model", exist_ok=True)
        commit = api.upload_folder(repo_id=repo, folder_path=folder, repo_type="model",
                                   commit_message=f"sfbus push of {run_dir.name}")
    except Exception as error:  # the client's errors have no common base (HTTP, token, offline)
        raise SfbusError(f"cannot upload {folder} to {repo}: {type(error).__name__}: {error}; "
                         "the folder is kept (log in with `hf auth login`, then push again)"
                         ) from None
    print(f"uploaded to {getattr(commit, 'commit_url', repo)}")
    return 0
