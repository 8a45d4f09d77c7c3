"""``sfbus enjoy``: returns printed, videos at the env's native size, RNN reset, clear errors."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import cv2
import imageio_ffmpeg
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from sfbus.cli import main
from sfbus.topology import load_topology
from sfbus_components.commands.enjoy import play
from sfbus_components.datapath.record import TrajectoryWriter
from sfbus_components.datapath.settings import build_policy
from sfbus_components.envs import EnvSpec, MultiAgentEnv, ObsField, make_env
from sfbus_components.learning.checkpoint import config_fingerprint, save_checkpoint

ROOT = Path(__file__).resolve().parents[3]
EPISODE = re.compile(
    r"^episode (\d+): return (-?\d+\.\d+)( \(true -?\d+\.\d+\))?, length (\d+)"
    r"( \(cut at --max-steps\))?$", re.MULTILINE)


def make_run(run_dir: Path, topology_file: str, overrides: tuple[str, ...] = ()) -> Path:
    """A run directory as `sfbus run` leaves it: topology snapshot plus one learner checkpoint."""
    topology = load_topology(ROOT / "topologies" / topology_file, overrides)
    run_dir.mkdir()
    (run_dir / "topology.yaml").write_text(yaml.safe_dump(topology.document, sort_keys=False))
    policy = next(a.params.policy for p in topology.processes for a in p.actors
                  if a.class_path == "sfbus_components.learning.learner:Learner")
    [rollout] = topology.actors_of(TrajectoryWriter)  # the data path: env and model
    data = rollout.spec.params
    torch.manual_seed(0)
    state = {"policy": build_policy(data).state_dict(), "optimizer": {}, "version": 7,
             "env_frames": 1234, "train_steps": 6, "samples": 1234,
             "config": config_fingerprint(data.env, data.model)}
    save_checkpoint(run_dir / "checkpoints" / f"policy_{policy}", state, 7, keep=1)
    return run_dir


def enjoy(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run `sfbus enjoy ARGS` in this process: (exit code, stdout, stderr)."""
    code = main(["enjoy", *args])
    out, err = capsys.readouterr()
    return code, out, err


def episodes(out: str) -> list[tuple[float, int, bool]]:
    """The (return, length, cut) of each episode line of the output."""
    return [(float(m[2]), int(m[4]), bool(m[5])) for m in EPISODE.finditer(out)]


def true_returns_shown(out: str) -> list[bool]:
    """Whether each episode line also shows the env's true (unshaped) return."""
    return [bool(m[3]) for m in EPISODE.finditer(out)]


def mp4_frames(path: Path) -> tuple[int, tuple[int, int]]:
    """Frames of an mp4 and their (width, height)."""
    count, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    reader = imageio_ffmpeg.read_frames(str(path))
    try:
        size = next(reader)["size"]
    finally:
        reader.close()
    return count, tuple(size)


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CartPole run directory with an (untrained) checkpoint of policy 0."""
    return make_run(tmp_path_factory.mktemp("enjoy") / "cartpole", "cartpole.yaml")


def test_prints_returns_and_records_gif_and_mp4(cartpole_run, tmp_path, capsys):
    gif, mp4 = tmp_path / "play.gif", tmp_path / "clips" / "play.mp4"
    code, out, err = enjoy(capsys, str(cartpole_run), "--episodes", "2", "--max-steps", "12",
                           "--video", str(gif), "--fps", "50", "--seed", "1")
    assert code == 0, err
    assert "policy 0 of" in out and "checkpoint_000000007.pt (version 7" in out
    played = episodes(out)
    assert len(played) == 2
    assert all(0 < length <= 12 and ret == length for ret, length, _ in played)  # +1 per step
    assert all(cut == (length == 12) for _, length, cut in played)
    steps = sum(length for _, length, _ in played)
    mean = re.search(r"^mean return (-?\d+\.\d+), mean length (\d+\.\d+) over 2 episodes$", out,
                     re.MULTILINE)
    assert mean and float(mean[1]) == pytest.approx(steps / 2, abs=0.01)
    assert f"video {gif}: {steps} frames, 600x400" in out
    # One frame per step. GIF merges identical consecutive frames into one longer frame, so
    # check the frames' total duration (20 ms each at 50 fps) rather than their number.
    with Image.open(gif) as image:
        assert image.size == (600, 400)
        durations = []
        for index in range(image.n_frames):
            image.seek(index)
            durations.append(image.info["duration"])
    assert sum(durations) == 20 * steps and len(durations) <= steps

    # the same seed and deterministic actions replay the same episodes, into an mp4 this time
    code, out, err = enjoy(capsys, str(cartpole_run), "--episodes", "2", "--max-steps", "12",
                           "--video", str(mp4), "--seed", "1", "--deterministic")
    assert code == 0, err
    replay = episodes(out)
    code, out2, _ = enjoy(capsys, str(cartpole_run), "--episodes", "2", "--max-steps", "12",
                          "--seed", "1", "--deterministic")
    assert episodes(out2) == replay
    assert mp4_frames(mp4) == (sum(length for _, length, _ in replay), (600, 400))


def test_doom_video_is_native_160x120(tmp_path, capsys):
    run = make_run(tmp_path / "doom", "doom_basic.yaml")
    video = tmp_path / "doom.mp4"
    code, out, err = enjoy(capsys, str(run), "--episodes", "1", "--max-steps", "6",
                           "--video", str(video))
    assert code == 0, err
    [(_, length, cut)] = episodes(out)
    assert true_returns_shown(out) == [not cut]  # VizDoom's unshaped score comes at episode end
    assert f"{length} frames, 160x120" in out
    assert mp4_frames(video) == (length, (160, 120))


@pytest.mark.parametrize("resolution", [(128, 72), None])
def test_doom_render_is_the_observed_frame_at_native_size(resolution):
    with make_env("doom_basic", resolution=resolution) as env:
        obs = env.spec.empty_obs()
        env.reset_into(obs, seed=3)
        env.step_into(np.array([[1]]), obs)
        frame = env.render()
        assert frame.shape == (120, 160, 3) and frame.dtype == np.uint8
        seen = obs["obs"][0].transpose(1, 2, 0)
        if resolution is None:
            assert np.array_equal(frame, seen)
        else:
            assert np.array_equal(cv2.resize(frame, resolution, interpolation=cv2.INTER_LINEAR),
                                  seen)


def test_bad_input_is_one_error_line_and_exit_2(cartpole_run, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "topology.yaml").write_text((cartpole_run / "topology.yaml").read_text())
    other = make_run(tmp_path / "other", "cartpole.yaml", ("model.mlp_layers=[32]",))
    foreign = next((other / "checkpoints" / "policy_0").iterdir())
    cases = {
        (str(tmp_path),): "not a run directory",
        (str(cartpole_run), "--policy", "3"): "has no such policy (it trains 0)",
        (str(empty),): "no checkpoint of policy 0",
        (str(cartpole_run), "--video", "x.avi"): "unsupported format '.avi'",
        (str(cartpole_run), "--checkpoint", str(tmp_path / "nope.pt")): "no such file",
        (str(cartpole_run), "--checkpoint", str(foreign)): "saved with a different configuration",
        (str(cartpole_run), "--episodes", "0"): "--episodes must be >= 1",
    }
    for args, message in cases.items():
        code, out, err = enjoy(capsys, *args)
        assert code == 2, args
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
        assert "episode" not in out


class CountingEnv(MultiAgentEnv):
    """Agent i's episodes last ``lengths[i]`` steps, reward 1 per step; obs = step in episode."""

    def __init__(self, lengths: tuple[int, ...]) -> None:
        self.lengths = np.array(lengths)
        self.t = np.zeros(len(lengths), np.int64)
        self._spec = EnvSpec({"obs": ObsField((1,), "float32")}, action_heads=(2,),
                             num_agents=len(lengths))

    @property
    def spec(self) -> EnvSpec:
        """One float per agent, one binary head."""
        return self._spec

    def reset_into(self, obs_out, seed=None) -> None:
        """Start every agent's episode."""
        self.t[:] = 0
        obs_out["obs"][:, 0] = self.t

    def step_into(self, actions, obs_out):
        """Advance; an agent whose episode ends starts the next one at once."""
        self.t += 1
        ended = self.t >= self.lengths
        self.t[ended] = 0
        obs_out["obs"][:, 0] = self.t
        n = len(self.t)
        return np.ones(n, np.float32), ended, np.zeros(n, bool), [{} for _ in range(n)]

    def close(self) -> None:
        """Nothing to release."""


class CountingPolicy:
    """Its RNN state counts the steps it has seen; records the state it was given."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def step(self, obs, rnn, deterministic=False):
        """Action 0; state + 1."""
        self.seen.append(rnn[:, 0].clone())
        rows = rnn.shape[0]
        return SimpleNamespace(actions=torch.zeros(rows, 1, dtype=torch.int64),
                               rnn_state=rnn + 1)


def test_rnn_state_is_zeroed_after_each_agents_episode():
    policy = CountingPolicy()
    played = play([policy] * 2, range(2), 2, CountingEnv((2, 3)), 4)
    assert [(e.episode_return, e.length, e.cut) for e in played] == [
        (2.0, 2, False), (3.0, 3, False), (2.0, 2, False), (2.0, 2, False)]
    # agent 0 restarts every 2 steps, agent 1 every 3: the state entering each step counts the
    # steps of the running episode so far
    assert [s.tolist() for s in policy.seen] == [[0, 0], [1, 1], [0, 2], [1, 0], [0, 1], [1, 2]]


def test_max_steps_cuts_and_restarts_the_episode():
    policy = CountingPolicy()
    played = play([policy], [0], 1, CountingEnv((5,)), 2, max_steps=3)
    assert [(e.episode_return, e.length, e.cut) for e in played] == [(3.0, 3, True), (3.0, 3, True)]
    assert [s.item() for s in policy.seen] == [0, 1, 2, 0, 1, 2]


def test_unusable_video_bad_fps_and_bad_seed_are_one_error_line(cartpole_run, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = {  # each was a traceback with exit 1 (a NaN frame rate only after playing)
        ("--video", str(a_file / "v.mp4")): f"--video {a_file / 'v.mp4'}: cannot write it",
        ("--video", str(tmp_path / "v.gif"), "--fps", "nan"):
            "--fps must be a finite number > 0, not nan",
        ("--video", str(tmp_path / "v.gif"), "--fps", "inf"):
            "--fps must be a finite number > 0, not inf",
        ("--seed", "-1"): "--seed -1: seeds must lie in 0..4294967295",
        ("--seed", "4294967296"): "--seed 4294967296: seeds must lie in 0..4294967295",
    }
    for args, message in cases.items():
        code, out, err = enjoy(capsys, str(cartpole_run), "--episodes", "1", *args)
        assert code == 2, args
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
        assert "episode" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_enjoy_eval_and_export_take_the_best_checkpoint(tmp_path, capsys):
    run = make_run(tmp_path / "run", "cartpole.yaml")
    newest = next((run / "checkpoints" / "policy_0").glob("checkpoint_*.pt"))
    state = torch.load(newest, weights_only=True)
    save_checkpoint(run / "checkpoints" / "policy_0" / "best", {**state, "version": 9}, 9, keep=1)
    code, out, err = enjoy(capsys, str(run), "--checkpoint", "best", "--episodes", "1",
                           "--max-steps", "3")
    assert code == 0, err
    assert "checkpoint_000000009.pt (version 9," in out
    assert main(["eval", str(run), "--checkpoint", "best", "--episodes", "1",
                 "--out", str(tmp_path / "eval")]) == 0
    assert "(checkpoint_000000009.pt, version 9)" in capsys.readouterr().out
    assert main(["export", str(run), "--checkpoint", "best", "--onnx",
                 str(tmp_path / "p.onnx")]) == 0
    assert "checkpoint_000000009.pt (version 9) -> " in capsys.readouterr().out
    # without --checkpoint: the newest, not the best
    code, out, err = enjoy(capsys, str(run), "--episodes", "1", "--max-steps", "3")
    assert code == 0 and f"{newest.name} (version 7," in out
