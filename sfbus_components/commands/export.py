"""``sfbus export RUN_DIR --onnx OUT.onnx``: a trained policy as an ONNX model.

The model maps observations (and the recurrent state) to the action distribution and the value,
for any batch size. Inputs: one per observation key the model's encoder reads, in the env's key
order, dtype and shape with a leading batch axis (e.g. uint8 ``obs`` ``[B, 3, 72, 128]`` for
VizDoom, then ``measurements`` where the model reads it), then ``rnn_state`` float32 ``[B, S]``
for a recurrent core (zeros at an episode's start; absent for ``core: none``). An env with an
``action_mask`` observation has it as one more input after the encoder's keys (its dtype,
``[B, n]``, > 0 = allowed). Outputs: ``action_logits`` (the concatenated logits of the categorical
heads, masked ones at -1e9, or the Gaussian mean), ``action_mean`` (the Gaussian mean of a hybrid
action, whose ``action_logits`` are its heads' logits), ``log_std`` (Box and hybrid actions),
``value`` ``[B]`` in return units, and ``rnn_state_out``
(recurrent cores), to feed back with the next step.

Folded into the graph: the observation normalizer's running statistics as the learner last
published them, and the returns normalizer (so ``value`` needs no de-normalizing). The encoder
runs in float32: bfloat16 autocast is a CPU-specific speed choice, not part of the policy.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sfbus import BadInput, SfbusError
from sfbus_components.commands.enjoy import (
    EnjoyError,
    learner_params,
    make_play_env,
    own_spec,
    read_checkpoint,
)
from sfbus_components.commands.hub import run_directory
from sfbus_components.commands.outputs import check_writable_file
from sfbus_components.envs import EnvSpec
from sfbus_components.envs.spec import ACTION_MASK_KEY
from sfbus_components.models.core import Core, gru_cell
from sfbus_components.models.distributions import HybridDistribution
from sfbus_components.models.policy import Policy

BAD_INPUT = 2
OPSET = 18


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``export`` sub-command (the ``sfbus.commands`` entry point)."""
    parser = subparsers.add_parser(
        "export", help="write a trained policy as an ONNX model",
        description="Export a run's policy (newest, best or a given checkpoint) to ONNX: "
                    "observations and RNN state in, action distribution, value and RNN state "
                    "out, normalization folded in, any batch size.")
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="run directory of `sfbus run`, or hub:user/name")
    parser.add_argument("--onnx", required=True, metavar="OUT.onnx", help="file to write")
    parser.add_argument("--policy", type=int, default=None, metavar="N",
                        help="policy id (default: the run's only policy)")
    parser.add_argument("--checkpoint", metavar="PATH|best",
                        help="checkpoint file, or 'best' (default: the policy's newest)")
    parser.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    """Run ``sfbus export``; bad input is one ``error:`` line on stderr and exit code 2."""
    try:
        out = _check_output(Path(args.onnx))
        try:
            import onnxruntime  # noqa: F401  (checked: the model is verified with it)
            import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
        except ImportError as error:
            raise EnjoyError(f"sfbus export needs {error.name}: pip install 'sfbus[tools]'"
                             ) from None
        run_dir = run_directory(args.run_dir)
        params = learner_params(run_dir, args.policy)
        path, state = read_checkpoint(run_dir, params, args.checkpoint)
    except EnjoyError as error:  # one line, exit 2: printed by the CLI (a newline shows as \n)
        raise BadInput(str(error)) from None
    env = make_play_env(params, render=False)
    try:
        spec = own_spec(params, env.spec)  # a heterogeneous run's policy: its agents' spaces
    finally:
        env.close()
    policy = Policy(spec, params.data.model)
    policy.load_state_dict(state["policy"])
    try:
        names = export_onnx(policy, spec, out, state.get("returns_normalizer"))
    except OSError as error:  # the folder went away or filled up while exporting: exit 1
        raise SfbusError(f"--onnx {out}: cannot write it: {error.strerror or error}") from None
    print(f"policy {params.policy} of {run_dir}: {path.name} (version {state['version']}) -> "
          f"{out}; inputs {', '.join(names[0])}; outputs {', '.join(names[1])}")
    return 0


def _check_output(out: Path) -> Path:
    if out.suffix != ".onnx":
        raise EnjoyError(f"--onnx {out}: the file name must end in .onnx")
    check_writable_file(out, "--onnx", make_folder=False)
    return out


class OnnxPolicy(nn.Module):
    """The policy's step as one pure function, in float32, ready to trace."""

    def __init__(self, policy: Policy, returns_normalizer: dict[str, Tensor] | None,
                 masked: bool = False) -> None:
        super().__init__()
        self.model = copy.deepcopy(policy.model).float().eval()
        for encoder in self.model.encoders():
            encoder.precision = "float32"
        self.keys = [*self.model.encoder.keys, *([ACTION_MASK_KEY] if masked else [])]
        self.clip: dict[str, float] = {}
        for key, stats in policy.obs_normalizer.stats.items():
            # x * scale / std - mean / std, the normalizer's own arithmetic as two constants
            std = torch.sqrt(stats.var + stats.eps)
            self.register_buffer(f"scale_{key}", (stats.scale / std).float())
            self.register_buffer(f"offset_{key}", (-stats.mean / std).float())
            self.clip[key] = stats.clip
        mean, std = 0.0, 1.0
        if returns_normalizer is not None:  # the critic predicts normalized returns
            mean = float(returns_normalizer["mean"])
            std = float(torch.sqrt(returns_normalizer["var"] + 1e-8))
        self.value_mean, self.value_std = mean, std

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        """(obs..., [rnn_state]) -> (action_logits, [action_mean], [log_std], value,
        [rnn_state_out])."""
        obs = {}
        for key, x in zip(self.keys, inputs, strict=False):
            if key in self.clip:
                x = (x.float() * getattr(self, f"scale_{key}") + getattr(self, f"offset_{key}")
                     ).clamp(-self.clip[key], self.clip[key])
            obs[key] = x
        recurrent = self.model.state_size > 0
        state = inputs[len(self.keys)] if recurrent else torch.zeros(inputs[0].shape[0], 0)
        core_out, critic_core_out, new_state = self.model.core_step(obs, state, _cell_step)
        actor_in, critic_in = self.model.head_inputs(core_out, critic_core_out)
        dist = self.model.distribution(actor_in, obs.get(ACTION_MASK_KEY))
        if dist.is_categorical:
            outputs = [dist.params]
        elif isinstance(dist, HybridDistribution):
            outputs = [dist.logits, dist.mean, dist.log_std]
        else:
            outputs = [dist.mean, dist.log_std]
        value = self.model.critic(critic_in).squeeze(-1)
        outputs.append(value * self.value_std + self.value_mean)
        if recurrent:
            outputs.append(new_state)
        return tuple(outputs)

    def names(self) -> tuple[list[str], list[str]]:
        """The ONNX model's input and output names, in order."""
        recurrent = self.model.state_size > 0
        inputs = [*self.keys, *(["rnn_state"] if recurrent else [])]
        hybrid = self.model.action_heads is not None and self.model.action_dim is not None
        outputs = ["action_logits", *(["action_mean"] if hybrid else []),
                   *(["log_std"] if self.model.action_dim is not None else []),
                   "value", *(["rnn_state_out"] if recurrent else [])]
        return inputs, outputs


def _cell_step(core: nn.Module, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One step of a built-in GRU / LSTM as its cell equations (torch's gate order), layer by
    layer: torch.export cannot trace ``nn.GRU`` itself (it loops over a sequence), and a step
    needs no loop. A user's core is traced through its own ``step``."""
    if not isinstance(core, Core):
        return core.step(x, state)
    rnn = core.rnn
    if rnn is None:
        return x, state
    lstm = isinstance(rnn, nn.LSTM)
    layers = list((state.chunk(2, dim=1)[0] if lstm else state).chunk(core.num_layers, dim=1))
    cells = list(state.chunk(2, dim=1)[1].chunk(core.num_layers, dim=1)) if lstm else []
    for k in range(core.num_layers):
        gates_x = x @ getattr(rnn, f"weight_ih_l{k}").T + getattr(rnn, f"bias_ih_l{k}")
        gates_h = layers[k] @ getattr(rnn, f"weight_hh_l{k}").T + getattr(rnn, f"bias_hh_l{k}")
        if lstm:
            i, f, g, o = (gates_x + gates_h).chunk(4, dim=1)
            cells[k] = torch.sigmoid(f) * cells[k] + torch.sigmoid(i) * torch.tanh(g)
            layers[k] = torch.sigmoid(o) * torch.tanh(cells[k])
        else:
            layers[k] = gru_cell(gates_x, gates_h, layers[k])
        x = layers[k]
    return x, torch.cat(layers + cells, dim=1)


def export_onnx(policy: Policy, spec: EnvSpec, out: Path,
                returns_normalizer: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """Write ``policy`` (of an env of ``spec``) to ``out`` as ONNX; returns its (input,
    output) names."""
    module = OnnxPolicy(policy, returns_normalizer,
                        masked=ACTION_MASK_KEY in spec.observation_space).eval()
    inputs, outputs = module.names()
    examples = []
    for key in module.keys:
        field = spec.observation_space[key]
        examples.append(torch.zeros(2, *field.shape, dtype=getattr(torch, field.dtype)))
    if module.model.state_size > 0:
        examples.append(torch.zeros(2, module.model.state_size))
    batch = torch.export.Dim("batch", min=1)
    for chatty in ("torch.onnx", "onnxscript", "onnx_ir"):  # their progress notes, INFO level
        logging.getLogger(chatty).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        # deprecations between the exporter's own parts (torch, onnxscript): not ours to act on
        for category in (FutureWarning, DeprecationWarning):
            warnings.simplefilter("ignore", category)
        # every input's batch axis is the one "batch" dimension, as meant
        warnings.filterwarnings("ignore", ".*axis name: batch will not be used", UserWarning)
        # torch.export (dynamo) traces the Python as it runs: one graph, a symbolic batch axis
        program = torch.onnx.export(
            module, tuple(examples), dynamo=True, opset_version=OPSET, input_names=inputs,
            output_names=outputs, dynamic_shapes=(tuple({0: batch} for _ in examples),),
            verbose=False)
    partial = out.with_name(f".{out.name}.partial")  # a failed or killed export leaves no OUT
    try:
        program.save(str(partial))
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return inputs, outputs
