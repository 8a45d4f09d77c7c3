"""``sfbus export``: the ONNX model computes what the torch policy computes, at any batch size."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from sfbus.cli import main
from sfbus_components.commands.export import export_onnx
from sfbus_components.envs import ActionBox, EnvSpec, ObsField
from sfbus_components.models import ModelConfig
from sfbus_components.models.normalizers import ReturnsNormalizer
from sfbus_components.models.policy import Policy
from tests.components.commands.test_enjoy import make_run

IMAGE = EnvSpec({"obs": ObsField((3, 36, 48), "uint8"), "measurements": ObsField((4,), "float32")},
                action_heads=(3, 2))
VECTOR = EnvSpec({"obs": ObsField((6,), "float32")},
                 action_box=ActionBox((-1.0,) * 2, (1.0,) * 2, (2,)))
MASKED = EnvSpec({"obs": ObsField((6,), "float32"), "action_mask": ObsField((5,), "int8")},
                 action_heads=(3, 2))
HYBRID = replace(MASKED, action_box=ActionBox((-1.0,) * 2, (1.0,) * 2, (2,)))


def trained_policy(spec: EnvSpec, model: ModelConfig) -> Policy:
    """A policy with random weights and normalizer statistics far from their start."""
    torch.manual_seed(0)
    policy = Policy(spec, model)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
        for key, field in spec.observation_space.items():
            if key not in policy.obs_normalizer.stats:  # normalize_input off, or the mask
                continue
            sample = (torch.randint(0, 256, (64, *field.shape), dtype=torch.uint8)
                      if field.dtype == "uint8" else torch.randn(64, *field.shape) * 3 + 2)
            policy.obs_normalizer.stats[key].update(sample)
    return policy.eval()


def random_obs(spec: EnvSpec, batch: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    if "action_mask" in spec.observation_space:
        mask = torch.randint(0, 2, (batch, 5), dtype=torch.int8, generator=gen)
        mask[:, 0] = mask[:, 3] = 1
        return {**random_obs(replace(spec, observation_space={"obs": ObsField((6,), "float32")}),
                             batch, gen), "action_mask": mask}
    return {key: torch.randint(0, 256, (batch, *f.shape), dtype=torch.uint8, generator=gen)
            if f.dtype == "uint8" else torch.randn(batch, *f.shape, generator=gen) * 3 + 2
            for key, f in spec.observation_space.items()}


@pytest.mark.parametrize(("spec", "model"), [
    (IMAGE, ModelConfig(hidden=32, core="gru", core_size=16, architecture="full",
                        measurements_hidden=(8,), precision="float32")),
    (VECTOR, ModelConfig(core="none", mlp_layers=(32, 32))),
    (VECTOR, ModelConfig(core="lstm", core_size=8, mlp_layers=(16,))),
    (MASKED, ModelConfig(core="gru", core_size=8, mlp_layers=(16,))),
    (VECTOR, ModelConfig(core="lstm", core_size=8, rnn_num_layers=2, mlp_layers=(16,),
                         decoder_mlp_layers=(12,), actor_critic_share_weights=False)),
    (IMAGE, ModelConfig(encoder="resnet_impala", hidden=16, core="gru", core_size=8,
                        rnn_num_layers=2, precision="float32", normalize_input=False,
                        obs_subtract_mean=128.0, obs_scale=128.0)),
    (HYBRID, ModelConfig(core="gru", core_size=8, mlp_layers=(16,), adaptive_stddev=True)),
], ids=["conv_gru_full", "mlp_gaussian", "mlp_lstm", "mlp_masked", "lstm2_separate_decoder",
        "resnet_gru2_obs_scale", "mlp_masked_hybrid"])
def test_onnx_outputs_equal_the_torch_policy(tmp_path: Path, spec: EnvSpec,
                                             model: ModelConfig) -> None:
    policy = trained_policy(spec, model)
    returns = ReturnsNormalizer()
    returns.update(torch.randn(500) * 4 + 10)
    out = tmp_path / "policy.onnx"
    inputs, outputs = export_onnx(policy, spec, out, returns.state_dict())
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == inputs
    assert [o.name for o in session.get_outputs()] == outputs
    gen = torch.Generator().manual_seed(1)
    for batch in (1, 5, 33):
        obs = random_obs(spec, batch, gen)
        state = torch.randn(batch, policy.model.state_size, generator=gen)
        with torch.no_grad():
            step = policy.step(obs, state, deterministic=True)
        feed = {k: obs[k].numpy() for k in inputs if k != "rnn_state"}
        if "rnn_state" in inputs:
            feed["rnn_state"] = state.numpy()
        got = dict(zip(outputs, session.run(None, feed), strict=True))
        expected = {"action_logits": step.action_logits,
                    "value": returns.denormalize(step.value)}
        if "action_mean" in outputs:  # a hybrid's: the logits, the mean, then the log-std
            (expected["action_logits"], expected["action_mean"],
             expected["log_std"]) = step.action_logits.split([5, 2, 2], -1)
        elif "log_std" in outputs:  # a Gaussian's parameters are its mean, then its log-std
            expected["action_logits"], expected["log_std"] = step.action_logits.chunk(2, -1)
        if "rnn_state_out" in outputs:
            expected["rnn_state_out"] = step.rnn_state
        assert set(got) == set(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value.detach().numpy(), atol=1e-4, rtol=1e-4,
                                       err_msg=f"{name} at batch {batch}")


def test_export_command_writes_a_model_of_the_runs_policy(tmp_path, capsys) -> None:
    run = make_run(tmp_path / "run", "cartpole.yaml")
    out = tmp_path / "cartpole.onnx"
    code = main(["export", str(run), "--onnx", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert f"checkpoint_000000007.pt (version 7) -> {out}; inputs obs; outputs action_logits, " \
           f"value" in stdout
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits, value = session.run(None, {"obs": np.zeros((3, 4), np.float32)})
    assert logits.shape == (3, 2) and value.shape == (3,)


def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys) -> None:
    run = make_run(tmp_path / "run", "cartpole.yaml")
    cases = {
        (str(tmp_path), "--onnx", str(tmp_path / "a.onnx")): "not a run directory",
        (str(run), "--onnx", str(tmp_path / "missing" / "a.onnx")): "no such directory",
        (str(run), "--onnx", str(tmp_path / "a.pt")): "must end in .onnx",
        (str(run), "--onnx", str(tmp_path / "a.onnx"), "--policy", "2"): "no such policy",
        (str(run), "--onnx", str(tmp_path / "a.onnx"), "--checkpoint", "best"): "no best",
    }
    for args, message in cases.items():
        code = main(["export", *args])
        out, err = capsys.readouterr()
        assert code == 2, args
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
        assert out == ""
    assert not list(tmp_path.glob("*.onnx"))


def test_an_output_that_cannot_be_written_is_refused_before_exporting(tmp_path, capsys) -> None:
    run = make_run(tmp_path / "run", "cartpole.yaml")
    blocker = tmp_path / "taken.onnx"
    blocker.mkdir()
    cases = {
        str(blocker): "is a directory",
        # was: the whole export ran, then a FileNotFoundError traceback when saving
        "/proc/sfbus-test.onnx": "cannot write it: No such file or directory",
    }
    for out, message in cases.items():
        code = main(["export", str(run), "--onnx", out])
        stdout, err = capsys.readouterr()
        assert code == 2, out
        assert err == f"error: --onnx {out}: {message}\n"
        assert stdout == ""
    assert list(tmp_path.glob("*.onnx")) == [blocker] and not any(blocker.iterdir())
    assert not list(tmp_path.glob(".*.partial"))


def test_a_second_export_in_one_process_traces_afresh(tmp_path: Path) -> None:
    """What a trace builds is never cached for the next one (the padded heads' index was: a
    second export of a policy with heads of several sizes found the first trace's fake tensor)."""
    model = ModelConfig(core="gru", core_size=8, mlp_layers=(16,))
    for name in ("first", "second"):
        inputs, _ = export_onnx(trained_policy(MASKED, model), MASKED, tmp_path / f"{name}.onnx")
        assert (tmp_path / f"{name}.onnx").is_file() and "action_mask" in inputs
