"""A model of one's own (encoder and core by import path) and dict observations with several
keys, through the real command line: `sfbus run`, then `sfbus enjoy` / `eval` / `export` of the
run's checkpoint; a part that breaks the protocol is a located error before anything starts.

The user's parts and the test env live here, outside the package, as a user's module would:
children import them by path (`tests.components.models.test_user_model:...`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from examples.custom_model import GruCellCore
from sfbus_components.envs import EnvSpec, ObsField
from sfbus_components.envs.spec import EpisodeStats, MultiAgentEnv
from sfbus_components.models import ActorCritic, ModelConfig

ROOT = Path(__file__).parents[3]
CARTPOLE = str(ROOT / "topologies" / "cartpole.yaml")
HERE = "tests.components.models.test_user_model"
CORE = "examples.custom_model:GruCellCore"  # a user core: a GRU cell stepped by hand


class TinyEncoder(nn.Module):
    """A user encoder: one tanh layer over the vector `obs`."""

    def __init__(self, obs_spec: dict[str, tuple[tuple[int, ...], str]], cfg: ModelConfig) -> None:
        super().__init__()
        (size,) = obs_spec["obs"][0]
        self.out_size = 24
        self.layer = nn.Linear(size, self.out_size)

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        return torch.tanh(self.layer(obs["obs"]))


class NoOutSize(nn.Module):
    """Breaks the protocol: no `out_size`."""

    def __init__(self, obs_spec: dict, cfg: ModelConfig) -> None:
        super().__init__()
        self.layer = nn.Linear(obs_spec["obs"][0][0], 8)

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        return self.layer(obs["obs"])


class WrongWidth(NoOutSize):
    """Breaks the protocol: says 16 features, gives 8."""

    out_size = 16


class ImageVectorEnv(MultiAgentEnv):
    """Two observation keys, an image `camera` uint8 (3, 36, 36) and a vector `target` (2,):
    reward 1 for the action equal to the sign of target[0] (also drawn as the image's
    brightness); 8 steps an episode."""

    SPEC = EnvSpec({"camera": ObsField((3, 36, 36), "uint8"), "target": ObsField((2,), "float32")},
                   action_heads=(2,))

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.stats = EpisodeStats(1, 1)
        self.sign = 0

    @property
    def spec(self) -> EnvSpec:
        return self.SPEC

    def _observe(self, obs_out: dict[str, np.ndarray]) -> None:
        target = self.rng.standard_normal(2).astype(np.float32)
        self.sign = int(target[0] > 0)
        obs_out["target"][0] = target
        obs_out["camera"][0] = 200 if self.sign else 30

    def reset_into(self, obs_out: dict[str, np.ndarray], seed: int | None = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.stats.clear()
        self._observe(obs_out)

    def step_into(self, actions: np.ndarray, obs_out: dict[str, np.ndarray]):
        reward = np.array([float(actions[0, 0] == self.sign)], np.float32)
        self.stats.add(reward)
        info: dict = {}
        done = bool(self.stats.lengths[0] >= 8)
        if done:
            self.stats.finish(0, info)
        self._observe(obs_out)
        return reward, np.array([done]), np.array([False]), [info]

    def close(self) -> None:
        pass


def make_image_vector_env(**kwargs: object) -> ImageVectorEnv:
    """The factory a topology names: `env: <this module>:make_image_vector_env`."""
    return ImageVectorEnv(**kwargs)  # type: ignore[arg-type]


def sfbus(*args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    """`sfbus ARGS` in a process of its own, run from the repository (as a user's cwd)."""
    return subprocess.run([sys.executable, "-m", "sfbus", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def short_run(run_dir: Path, *overrides: str) -> dict:
    """A short real cartpole.yaml run with ``overrides``; its last progress record."""
    args = [f"--set={o}" for o in ("num_envs=4", "batch_size=256", *overrides)]
    done = sfbus("run", CARTPOLE, "--run-dir", str(run_dir), "--max-frames", "3000",
                 "--max-seconds", "150", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    lines = (run_dir / "progress.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_a_user_encoder_and_core_train_and_play_back(tmp_path: Path) -> None:
    run = tmp_path / "run"
    last = short_run(run, f"model.encoder={HERE}:TinyEncoder", f"model.core={CORE}",
                     "model.core_size=12")
    assert last["env_frames"] >= 3000 and last["policies"]["0"]["version"] >= 1
    checkpoint = torch.load(next((run / "checkpoints" / "policy_0").glob("*.pt")),
                            weights_only=False)
    assert checkpoint["config"]["model"]["encoder"] == f"{HERE}:TinyEncoder"
    assert "model.encoder.main.layer.weight" in checkpoint["policy"]  # the user's own layer
    assert "model.core.cell.weight_hh" in checkpoint["policy"]

    played = sfbus("enjoy", str(run), "--episodes", "2", "--max-steps", "50")
    assert played.returncode == 0, played.stderr[-3000:]
    assert played.stdout.count("episode ") >= 2
    scored = sfbus("eval", str(run), "--episodes", "2", "--envs", "2",
                   "--out", str(tmp_path / "eval"))
    assert scored.returncode == 0, scored.stderr[-3000:]

    onnx = pytest.importorskip("onnxruntime")
    out = tmp_path / "user.onnx"
    exported = sfbus("export", str(run), "--onnx", str(out))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "inputs obs, rnn_state; outputs action_logits, value, rnn_state_out" in exported.stdout
    session = onnx.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits, _, state = session.run(None, {"obs": np.zeros((3, 4), np.float32),
                                          "rnn_state": np.zeros((3, 12), np.float32)})
    assert logits.shape == (3, 2) and state.shape == (3, 12)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_an_image_and_a_vector_observation_train_through_the_multi_input_encoder(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    last = short_run(run, f"env={HERE}:make_image_vector_env", "model.hidden=32")
    assert last["env_frames"] >= 3000 and last["policies"]["0"]["version"] >= 1
    weights = torch.load(next((run / "checkpoints" / "policy_0").glob("*.pt")),
                         weights_only=False)["policy"]
    # both keys encoded (and normalized per key)
    assert "model.encoder.branches.camera.fc.0.weight" in weights
    assert weights["model.encoder.branches.target.net.0.weight"].shape == (64, 2)
    assert {"obs_normalizer.stats.camera.mean", "obs_normalizer.stats.target.mean"} <= set(weights)


def test_the_multi_input_encoder_concatenates_each_keys_branch() -> None:
    torch.manual_seed(0)
    spec = {k: (f.shape, f.dtype) for k, f in ImageVectorEnv.SPEC.observation_space.items()}
    model = ActorCritic(spec, (2,), None, ModelConfig(hidden=16, core="none", mlp_layers=(8,),
                                                      precision="float32"))
    encoder = model.encoder
    assert encoder.keys == ("camera", "target") and encoder.out_size == 16 + 8
    obs = {"camera": torch.randint(0, 256, (5, 3, 36, 36), dtype=torch.uint8),
           "target": torch.randn(5, 2)}
    expected = torch.cat([encoder.branches["camera"](obs["camera"].float() / 255.0),
                          encoder.branches["target"](obs["target"])], dim=1)
    torch.testing.assert_close(encoder(obs), expected)


def test_architecture_full_is_the_multi_input_encoder_on_obs_and_measurements() -> None:
    spec = {"obs": ((3, 36, 48), "uint8"), "measurements": ((4,), "float32"),
            "extra": ((2,), "float32")}
    full = ActorCritic(spec, (3,), None, ModelConfig(architecture="full", hidden=16,
                                                     measurements_hidden=(8, 8)))
    assert full.encoder.keys == ("obs", "measurements")  # `extra` not read
    assert full.encoder.out_size == 16 + 8
    simplified = ActorCritic(spec, (3,), None, ModelConfig(architecture="simplified", hidden=16))
    assert simplified.encoder.keys == ("obs",) and simplified.encoder.out_size == 16


def test_user_parts_go_through_the_same_door_as_the_built_ins() -> None:
    cfg = ModelConfig(encoder=f"{HERE}:TinyEncoder", core=CORE, core_size=6)
    model = ActorCritic({"obs": ((4,), "float32")}, (2,), None, cfg)
    assert isinstance(model.encoder.main, TinyEncoder) and isinstance(model.core, GruCellCore)
    assert model.state_size == 6
    out = model.forward_step({"obs": torch.randn(3, 4)}, model.initial_state(3))
    assert out.rnn_state.shape == (3, 6) and out.actions.shape == (3, 1)


SET = "error: --set: settings.model."


def _rollout_actor_line() -> int:
    """The line of ``appo.yaml`` that declares its rollout actor: a probe's error points there."""
    lines = (ROOT / "topologies" / "appo.yaml").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1)
                if line.strip().startswith("rollout: {class:"))


PROBED = f"error: topologies/appo.yaml:{_rollout_actor_line()}:7: actor 'rollout': model."


@pytest.mark.parametrize(("setting", "message"), [
    ("model.encoder=convsimple", f"{SET}encoder: encoder 'convsimple' is not a built-in encoder "
                                 "(auto, conv_simple, nature_cnn, convnet_impala, mlp, "
                                 "resnet_impala) nor an "
                                 "import path 'package.module:Class'; did you mean "
                                 "'conv_simple'?"),
    ("model.encoder=nosuchpkg.nets:Enc", f"{SET}encoder: encoder 'nosuchpkg.nets:Enc': cannot "
                                         "import module 'nosuchpkg.nets': no module named "
                                         "'nosuchpkg' (not installed, nor on PYTHONPATH or in "
                                         "the working directory)"),
    (f"model.encoder={HERE}:TinyEncodr", f"{SET}encoder: encoder '{HERE}:TinyEncodr': module "
                                         f"'{HERE}' has no attribute 'TinyEncodr'; did you mean "
                                         "'TinyEncoder'?"),
    (f"model.core={HERE}:TinyEncoder", f"{SET}core: core '{HERE}:TinyEncoder' has no "
                                       "state_size_for(cfg)"),
    ("model.architecture=full", None),  # cartpole has no measurements: the built-in says so
    (f"model.encoder={HERE}:NoOutSize", f"{PROBED}encoder '{HERE}:NoOutSize': needs an "
                                        "attribute out_size, an int >= 1"),
    (f"model.encoder={HERE}:WrongWidth", f"{PROBED}encoder '{HERE}:WrongWidth': forward(obs) "
                                         "has shape [2, 8] on a probe batch, expected [2, 16]"),
])
def test_a_bad_model_part_is_a_located_error_before_anything_starts(
        tmp_path: Path, setting: str, message: str | None) -> None:
    done = sfbus("run", "topologies/cartpole.yaml", "--run-dir", str(tmp_path / "run"),
                 "--set", setting, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    expected = message or (f"{PROBED.removesuffix('model.')}architecture "
                           "'full' needs the observation keys ['obs', 'measurements'], but "
                           "the env has ['obs']")
    assert line.startswith(expected), line
    assert not (tmp_path / "run").exists()


def test_a_user_part_in_a_topology_file_is_checked_at_its_line(tmp_path: Path) -> None:
    topology = tmp_path / "mine.yaml"
    model = f"  model: {{encoder: {HERE}:TinyEncoder, architecture: simplified}}"
    topology.write_text(f"extends: {CARTPOLE}\nsettings:\n{model}\n")
    done = sfbus("validate", str(topology), timeout=120)
    assert done.returncode == 2
    column = model.index("simplified") + 1
    assert done.stderr.strip() == (
        f"error: {topology}:3:{column}: settings.model.architecture: architecture 'simplified' "
        f"chooses the keys of the built-in encoders; encoder '{HERE}:TinyEncoder' reads the "
        "keys it wants: leave architecture at auto (parameter 'model' of actor 'rollout')")
    topology.write_text(f"extends: {CARTPOLE}\n"
                        f"settings: {{model: {{encoder: {HERE}:TinyEncoder, core: none}}}}\n")
    done = sfbus("validate", str(topology), timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_worked_example_of_docs_models_keeps_the_core_contract() -> None:
    """examples/custom_model.py: its `sequence` gives what stepping `step` gives, resets
    included, built through the same door as a run builds it."""
    torch.manual_seed(0)
    cfg = ModelConfig(encoder="examples.custom_model:LayerNormEncoder",
                      core="examples.custom_model:GruCellCore", core_size=8, mlp_layers=(16,))
    model = ActorCritic({"obs": ((4,), "float32"), "extra": ((3,), "float32")}, (2,), None, cfg)
    assert model.encoder.out_size == 16 and model.state_size == 8
    obs = {"obs": torch.randn(3, 5, 4), "extra": torch.randn(3, 5, 3)}
    dones = torch.zeros(3, 5)
    dones[0, 1] = dones[2, 3] = 1.0
    start = torch.randn(3, 8)
    dist, values = model.forward_sequence(obs, start, dones)
    state = start
    for t in range(5):
        out = model.forward_step({k: v[:, t] for k, v in obs.items()}, state)
        torch.testing.assert_close(values[:, t], out.value)
        torch.testing.assert_close(dist.params[:, t], out.action_logits)
        state = out.rnn_state * (1.0 - dones[:, t : t + 1])
