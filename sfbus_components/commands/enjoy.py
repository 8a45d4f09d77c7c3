"""``sfbus enjoy RUN_DIR``: watch a trained policy play, print its returns, optionally film it.

The run's own topology snapshot (``RUN_DIR/topology.yaml``) says how the policy was trained: its
rollout actor carries the data path (env, its arguments, model config, seed), its learner actors
the policies trained (a snapshot written before the learner's parameters lost the data path's
reads the same, from its settings). The newest
checkpoint of that policy is loaded into a fresh policy, which then plays episodes in one env in
this process with the evaluator's loop (:mod:`sfbus_components.evaluation.episode_player`): the way
the rollout and inference workers act, observations through the normalizer in eval mode, RNN state
carried between steps and zeroed after an agent's episode ends. In a run of heterogeneous agents
(``agent_policies``) the policy acts for its own agents only, each other agent with its own
policy's newest checkpoint, and only its agents' episodes are printed.

Video convention: one frame per step, the frame the agent saw when it chose that step's action
(the first is the episode's reset frame). A video of N steps has N frames; the frame after an
episode's last step is not shown because the env resets at once (its "next" frame is the next
episode's first). Frames are the env's native picture: 160x120 for VizDoom (the model sees it
resized), gymnasium's ``rgb_array`` render for ``gym:`` and ``mujoco_`` envs (MuJoCo through
EGL unless ``MUJOCO_GL`` says otherwise). ``.mp4`` streams through the ffmpeg binary shipped with
``imageio-ffmpeg``; ``.gif`` holds frames in memory until the end and, being GIF, merges
identical consecutive frames (so it can have fewer), so keep GIFs short.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sfbus import BadInput
from sfbus_components.commands.hub import run_directory
from sfbus_components.commands.outputs import check_writable_file

if TYPE_CHECKING:
    from sfbus_components.evaluation.episode_player import Episode

BAD_INPUT = 2
_VIDEO_FORMATS = (".mp4", ".gif")
_DOOM_TICS_PER_SECOND = 35.0  # VizDoom's game clock; default video rate for envs without one


class EnjoyError(Exception):
    """Bad input to ``sfbus enjoy``: printed as one ``error:`` line, exit code 2."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``enjoy`` sub-command (the ``sfbus.commands`` entry point)."""
    parser = subparsers.add_parser(
        "enjoy", help="watch a trained policy play (returns, video)",
        description="Play episodes with the newest checkpoint of a run's policy; print each "
                    "episode's return and length, optionally record a video.")
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="run directory of `sfbus run`, or hub:user/name")
    parser.add_argument("--policy", type=int, default=None, metavar="N",
                        help="policy id (default: the run's only policy)")
    parser.add_argument("--checkpoint", metavar="PATH|best",
                        help="checkpoint file, or 'best' (default: the policy's newest)")
    parser.add_argument("--episodes", type=int, default=3, metavar="K",
                        help="episodes to play (default: 3)")
    parser.add_argument("--video", metavar="OUT",
                        help="record the frames the agent saw to OUT.mp4 or OUT.gif")
    parser.add_argument("--fps", type=float, default=None,
                        help="video frame rate (default: the env's real-time rate)")
    parser.add_argument("--deterministic", action="store_true",
                        help="take the most likely action instead of sampling")
    parser.add_argument("--max-steps", type=int, default=None, metavar="N",
                        help="cut an episode after N steps (it still counts)")
    parser.add_argument("--seed", type=int, default=None, help="env seed (default: random)")
    parser.set_defaults(func=cmd_enjoy)


def cmd_enjoy(args: argparse.Namespace) -> int:
    """Run ``sfbus enjoy``; bad input is one ``error:`` line on stderr and exit code 2."""
    try:
        return enjoy(args)
    except EnjoyError as error:  # one line, exit 2: printed by the CLI (a newline shows as \n)
        raise BadInput(str(error)) from None


def enjoy(args: argparse.Namespace) -> int:
    """Load the policy, play ``args.episodes`` episodes, print returns; raises EnjoyError."""
    if args.episodes < 1:
        raise EnjoyError(f"--episodes must be >= 1, not {args.episodes}")
    if args.max_steps is not None and args.max_steps < 1:
        raise EnjoyError(f"--max-steps must be >= 1, not {args.max_steps}")
    if args.fps is not None and not 0 < args.fps < math.inf:
        raise EnjoyError(f"--fps must be a finite number > 0, not {args.fps:g}")
    if args.seed is not None:
        check_seeds(args.seed, 1)
    video = Path(args.video) if args.video else None
    if video is not None and video.suffix.lower() not in _VIDEO_FORMATS:
        raise EnjoyError(f"--video {video}: unsupported format {video.suffix or '(none)'!r}; "
                         f"use {' or '.join(_VIDEO_FORMATS)}")
    run_dir = run_directory(args.run_dir)
    params = learner_params(run_dir, args.policy)
    path, state = read_checkpoint(run_dir, params, args.checkpoint)
    if video is not None:
        check_writable_file(video, "--video")
    print(f"policy {params.policy} of {run_dir}: {path.name} (version {state['version']}, "
          f"{state['env_frames']:,} env frames), env {params.data.env}")
    env = make_play_env(params, render=video is not None)
    writer = None
    try:
        players, counted = agents_players(run_dir, params, state, env.spec)
        if len(counted) < env.spec.num_agents:
            print(f"agents {', '.join(env.spec.agent_names[a] for a in counted)} play policy "
                  f"{params.policy}; the others their own policies' newest checkpoints")
        if video is not None:
            render, default_fps = frame_source(env, params.data.env)
            writer = VideoWriter(video, args.fps or default_fps, render)
        episodes = play(players, counted, params.data.state_size, env, args.episodes,
                        deterministic=args.deterministic,
                        max_steps=args.max_steps, seed=args.seed,
                        on_frame=writer.append if writer else None)
    finally:
        if writer is not None:
            writer.close()  # also on Ctrl-C: keep what was filmed
        env.close()
    for i, e in enumerate(episodes, 1):
        true = "" if math.isnan(e.true_return) else f" (true {e.true_return:.2f})"
        print(f"episode {i}: return {e.episode_return:.2f}{true}, length {e.length}"
              + (" (cut at --max-steps)" if e.cut else ""))
    returns = [e.episode_return for e in episodes]
    lengths = [e.length for e in episodes]
    trues = [e.true_return for e in episodes if not math.isnan(e.true_return)]
    true = f" (true {sum(trues) / len(trues):.2f})" if trues else ""
    print(f"mean return {sum(returns) / len(returns):.2f}{true}, mean length "
          f"{sum(lengths) / len(lengths):.1f} over {len(episodes)} episodes")
    if writer is not None:
        print(f"video {video}: {writer.frames} frames, {writer.size[0]}x{writer.size[1]}")
    return 0


MAX_SEED = 2**32 - 1  # envs take 32-bit seeds (VizDoom's, numpy's legacy generators)


def check_seeds(first: int, count: int) -> None:
    """Seeds ``first .. first + count - 1`` must all be ones every env accepts."""
    if first < 0 or first + count - 1 > MAX_SEED:
        span = f"--seed {first}" if count == 1 else f"--seed {first} with {count} episodes"
        raise EnjoyError(f"{span}: seeds must lie in 0..{MAX_SEED}")


@dataclass(frozen=True)
class TrainedPolicy:
    """One policy of a run, as its topology snapshot trained it."""

    policy: int
    """The policy's id."""
    learner: Any
    """Its learner's ``Params`` (APPO's settings, among them)."""
    data: Any
    """The run's data path (``DataPathParams``: env, its arguments, model, seed)."""


def learners(run_dir: Path) -> dict[int, TrainedPolicy]:
    """Every policy a learner trains in the run's topology snapshot, by policy id."""
    snapshot = run_dir / "topology.yaml"
    if not snapshot.is_file():
        raise EnjoyError(f"{run_dir}: not a run directory (no topology.yaml)")
    from sfbus import load_topology
    from sfbus_components.datapath.record import TrajectoryWriter
    from sfbus_components.datapath.settings import data_path_params
    from sfbus_components.learning.learner import Learner

    topology = load_topology(snapshot)
    writers = topology.actors_of(TrajectoryWriter)
    if len(writers) != 1:
        raise EnjoyError(f"{snapshot}: the data path takes one rollout actor (a "
                         f"{TrajectoryWriter.__name__} subclass); it has {len(writers)}")
    data = data_path_params(writers[0].spec.params)
    found = {learner.spec.params.policy: TrainedPolicy(learner.spec.params.policy,
                                                       learner.spec.params, data)
             for learner in topology.actors_of(Learner)}
    if not found:
        raise EnjoyError(f"{snapshot}: no learner actor "
                         "(class sfbus_components.learning.learner:Learner)")
    return found


def learner_params(run_dir: Path, policy: int | None) -> TrainedPolicy:
    """The policy ``policy`` of the run (None: the run's only one)."""
    found = learners(run_dir)
    known = ", ".join(str(p) for p in sorted(found))
    if policy is None:
        if len(found) > 1:
            raise EnjoyError(f"{run_dir} trains policies {known}; choose one with --policy")
        return next(iter(found.values()))
    if policy not in found:
        raise EnjoyError(f"--policy {policy}: {run_dir} has no such policy (it trains {known})")
    return found[policy]


def read_checkpoint(run_dir: Path, params: TrainedPolicy,
                    checkpoint: str | None) -> tuple[Path, dict]:
    """The checkpoint to play and its state: the file ``checkpoint``, the policy's best
    (``"best"``, see :mod:`sfbus_components.learning.checkpoint_schedule`), or its newest (None)."""
    from sfbus_components.learning.checkpoint import (
        CheckpointError,
        UnreadableCheckpoint,
        config_fingerprint,
        load_checkpoint,
        load_newest,
    )

    config = config_fingerprint(params.data.env, params.data.model)
    try:
        folder = run_dir / "checkpoints" / f"policy_{params.policy}"
        if checkpoint == "best":
            found = load_newest(folder / "best", config, log=logging.getLogger(__name__))
            if found is None:
                raise EnjoyError(
                    f"{run_dir}: no best checkpoint of policy {params.policy} in {folder / 'best'}"
                    f" (written once the policy trained on save_best_after env frames)")
            return found
        if checkpoint is not None:
            path = Path(checkpoint)
            if not path.is_file():
                raise EnjoyError(f"--checkpoint {path}: no such file")
            try:
                return path, load_checkpoint(path, config)
            except UnreadableCheckpoint:  # the user's file: no advice to delete it
                raise EnjoyError(f"--checkpoint {path}: not a readable checkpoint (not written "
                                 "by sfbus, or truncated)") from None
        found = load_newest(folder, config, log=logging.getLogger(__name__))
    except CheckpointError as error:
        raise EnjoyError(str(error)) from None
    if found is None:
        raise EnjoyError(f"{run_dir}: no checkpoint of policy {params.policy} in {folder} "
                         "(a run writes one every checkpoint_every_s and when it stops)")
    return found


def build_from_checkpoint(spec: Any, params: TrainedPolicy, state: dict) -> Any:
    """The policy for env ``spec`` with the checkpoint's weights, ready for inference."""
    from sfbus_components.models.policy import Policy

    # from the env at hand: no second env just to read its spec
    policy = Policy(spec, params.data.model)
    policy.load_state_dict(state["policy"])
    return policy.prepare_for_inference()


def agents_players(run_dir: Path, params: TrainedPolicy, state: dict,
                   spec: Any) -> tuple[list[Any], list[int]]:
    """Who acts for each agent of the env, and the agents whose episodes count: the checkpoint
    ``state`` of policy ``params`` for every agent; in a run of heterogeneous agents
    (``agent_policies``) for its own agents only, each other agent acting with its policy's
    newest checkpoint."""
    data = params.data
    if not data.agent_policies:
        played = build_from_checkpoint(spec, params, state)
        return [played] * spec.num_agents, list(range(spec.num_agents))
    from sfbus_components.datapath.agent_policies import resolve_agent_policies

    table, specs = resolve_agent_policies(spec, data.agent_policies, data.num_policies)
    by_policy = {params.policy: build_from_checkpoint(specs[params.policy], params, state)}
    for other in sorted(set(table) - {params.policy}):
        trained = learner_params(run_dir, other)
        by_policy[other] = build_from_checkpoint(specs[other], trained,
                                                 read_checkpoint(run_dir, trained, None)[1])
    return ([by_policy[p] for p in table],
            [agent for agent, p in enumerate(table) if p == params.policy])


def play(players: Sequence[Any], counted: Iterable[int], state_size: int, env: Any,
         episodes: int, *, deterministic: bool = False, max_steps: int | None = None,
         seed: int | None = None, on_frame: Callable[[], None] | None = None) -> list[Episode]:
    """Play until ``episodes`` episodes of the ``counted`` agents end, agent ``i`` acting with
    ``players[i]``, the RNN state ``state_size`` wide: return, length, the env's unshaped score
    (true return) and whether ``max_steps`` cut it.

    ``on_frame`` is called before every step (the frame the agent is about to act on).
    """
    import torch

    from sfbus_components.evaluation.episode_player import EpisodePlayer

    player = EpisodePlayer(env, state_size, deterministic, max_steps=max_steps,
                           before_step=on_frame)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a batch of one row: more threads only contend for the cores
    try:
        player.start(players, list(counted), seed)
        player.play(sys.maxsize, episodes)  # in one go: no event loop to yield to
    finally:
        torch.set_num_threads(threads)
    return player.episodes[:episodes]


def own_spec(params: TrainedPolicy, spec: Any) -> Any:
    """The spec policy ``params`` acts in: the env's ``spec``, or in a run of heterogeneous
    agents (``agent_policies``) its own agents' spaces."""
    data = params.data
    if not data.agent_policies:
        return spec
    from sfbus_components.datapath.agent_policies import resolve_agent_policies

    return resolve_agent_policies(spec, data.agent_policies, data.num_policies)[1][params.policy]


def make_play_env(params: TrainedPolicy, *, render: bool) -> Any:
    """The env the policy of ``params`` trained on (``render``: with frames for a video); in a
    run of heterogeneous agents :func:`agents_players` says who acts for each agent."""
    from sfbus_components.envs import make_env
    from sfbus_components.envs.action_bounds import bound_actions

    data = params.data
    kwargs = dict(data.env_kwargs)
    if render and data.env.startswith(("gym:", "mujoco_")):
        kwargs.setdefault("render_mode", "rgb_array")
        # gymnasium draws with pygame, whose SDL would look for a display and complain on stderr;
        # MuJoCo with GLFW, which needs one (a fatal error without): EGL renders headless.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("MUJOCO_GL", "egl")
    return bound_actions(make_env(data.env, **kwargs), data.model.action_bounds)


def frame_source(env: Any, name: str) -> tuple[Callable[[], Any], float]:
    """The env's frame reader for videos (native RGB ``[H, W, 3]``) and its real-time rate."""
    render = getattr(env, "render", None)
    if callable(render):  # VizDoom's native frame (and any env of ours with a render())
        return render, _DOOM_TICS_PER_SECOND / env.spec.frameskip
    inner = getattr(env, "env", None)  # a gymnasium env inside our adapter (and its wrappers)
    while inner is not None and getattr(inner, "render_mode", None) != "rgb_array":
        inner = getattr(inner, "env", None)
    if inner is not None:
        return inner.render, float(inner.metadata.get("render_fps") or 30)
    raise EnjoyError(f"--video: env {name} has no frames to record (no render() method)")


class VideoWriter:
    """Frames from ``render()`` into an ``.mp4`` (streamed through ffmpeg) or a ``.gif``."""

    def __init__(self, path: Path, fps: float, render: Callable[[], Any]) -> None:
        self.path = path
        self.fps = fps
        self.render = render
        self.frames = 0
        self.size = (0, 0)
        """(width, height) of the frames as written."""
        self._gif = path.suffix.lower() == ".gif"
        self._held: list[Any] = []
        self._stream: Any = None
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self) -> None:
        """Render the env's current frame and add it."""
        import numpy as np

        frame = np.asarray(self.render())[..., :3]
        if self._gif:
            self._held.append(frame.copy())  # GIF encoders want every frame at the end
        else:
            # yuv420p needs even sides: pad odd ones by one edge row / column
            h, w = frame.shape[:2]
            if h % 2 or w % 2:
                frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
            if self._stream is None:
                import imageio.v2 as imageio

                self._stream = imageio.get_writer(
                    self.path, format="FFMPEG", mode="I", fps=self.fps, codec="libx264",
                    macro_block_size=1, ffmpeg_log_level="error")
            self._stream.append_data(frame)
        self.size = (frame.shape[1], frame.shape[0])
        self.frames += 1

    def close(self) -> None:
        """Finish the file (safe to call twice)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        elif self._held:
            import imageio.v3 as iio

            iio.imwrite(self.path, self._held, extension=".gif", duration=1000.0 / self.fps,
                        loop=0)
            self._held = []
