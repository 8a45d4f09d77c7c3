"""The inference step on CPU with the weights reordered once for oneDNN: the conv encoder + GRU.

Inference workers run the policy on a few rows at a time (one or two rollout splits, 8-32 rows),
where eager PyTorch spends much of a pass outside the arithmetic: oneDNN reorders every weight
into its blocked layout on every call, and the GRU's matmuls go through a plain GEMM.
:class:`PackedStep` reorders the weights once per weights refresh (``pack``) and runs the same
network, in the precisions the learner trains it in, on the reordered operands: the conv stack
and the FC layer in the encoder's compute dtype (bfloat16 as under autocast, or float32 where
the CPU has no fast bfloat16), the GRU's matrix products in its ``products_precision`` (bfloat16
with the bias, as the learner's BPTT on this CPU computes them, else float32), its gates and
state and the heads in float32. The behaviour policy's log-probabilities are then the learner's
to rounding. On the default doom_basic model this is ~1.3x faster per pass at 8-16 rows in either
dtype (``python -m bench.arithmetic``). It is inference only: the learner trains the eager model.

Where the FC layer and the GRU's products compute in float32, the model's ``inference_weights``
(``auto``: where sfbus's C kernels are built) keeps their weights rounded to bfloat16 and reads
them through a C kernel of float32 arithmetic: a self-play pass of one or two rows is bound by
reading those weights (the duel's ``full`` model, 4 policies in turn, AVX2: 1,034 -> 675 us a
one-row pass). The behaviour policy is then the learner's with those weights rounded.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sfbus_components.models import native, precision
from sfbus_components.models.actor_critic import ActorCritic, StepOutput
from sfbus_components.models.core import GruCore, IdentityCore, gru_cell
from sfbus_components.models.encoders import MlpEncoder, ObsEncoder, StackEncoder

_CPU = torch.device("cpu")
# Rows the packed layouts are tuned for: a rollout split of the default run. Any row count works.
_TUNED_ROWS = 16
# Up to this many rows, the C kernel over bfloat16 weights is faster than oneDNN's float32 even
# with the weights in cache (AMD EPYC, AVX2: 16 rows of the duel's FC and GRU 810 against 841 us;
# 1 row 133 against 334 us with 4 policies' weights taken in turn); past it, oneDNN's blocking.
_NARROW_ROWS = 16


def _mkldnn_ops_available() -> bool:
    """Whether this torch build has the oneDNN ops packing relies on."""
    ops = ("_reorder_convolution_weight", "_convolution_pointwise", "_reorder_linear_weight",
           "_linear_pointwise")
    return torch.backends.mkldnn.is_available() and all(
        hasattr(torch.ops.mkldnn, op) for op in ops)


def packable(model: ActorCritic) -> bool:
    """Whether :class:`PackedStep` can run ``model``: the built-in conv encoder over the key
    ``obs`` (beside MLP branches for vector keys, as the ``full`` architecture's
    measurements), the built-in one-layer GRU or no core, shared by actor and critic (an LSTM,
    stacked layers, separate weights or a user's part run the eager model), on a CPU with
    oneDNN (with bfloat16 kernels where the encoder computes in bfloat16)."""
    encoder = model.encoder
    return (isinstance(encoder, ObsEncoder) and "obs" in encoder.branches
            and isinstance(encoder.main, StackEncoder) and encoder.main.stack == "conv_simple"
            and all(isinstance(branch, MlpEncoder) for key, branch in encoder.branches.items()
                    if key != "obs")
            and isinstance(model.core, GruCore | IdentityCore) and model.core.num_layers == 1
            and model.critic_encoder is None and _mkldnn_ops_available()
            and (encoder.compute_dtype(_CPU) == torch.float32 or precision.onednn_has_bf16()))


class _PackedConv:
    """One conv layer with its weight in oneDNN's blocked layout, in ``dtype``."""

    def __init__(self, conv: torch.nn.Conv2d, input_size: list[int], dtype: torch.dtype) -> None:
        self.conv = conv
        self.input_size = input_size
        self.stride = list(conv.stride)
        self.dtype = dtype
        self.pack()

    def pack(self) -> None:
        """Reorder the current weights."""
        weight = self.conv.weight.detach().to(self.dtype, memory_format=torch.channels_last)
        self.weight = torch.ops.mkldnn._reorder_convolution_weight(
            weight, [0, 0], self.stride, [1, 1], 1, self.input_size)
        self.bias = self.conv.bias.detach().to(self.dtype)

    def __call__(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._convolution_pointwise(
            x, self.weight, self.bias, [0, 0], self.stride, [1, 1], 1, "none", [], "")


class _PackedLinear:
    """``weight @ x + bias`` with the weight in oneDNN's blocked layout, in ``dtype``; or, with
    ``bf16_weights`` (float32 layers only), the weight rounded to bfloat16 and the arithmetic
    float32: passes of up to :data:`_NARROW_ROWS` rows read the rounded weights through sfbus's
    C kernel (half the bytes), wider ones go through oneDNN on the same rounded values."""

    def __init__(self, weight: Tensor, bias: Tensor, dtype: torch.dtype,
                 bf16_weights: bool = False) -> None:
        self.source = weight, bias
        self.dtype = dtype
        self.bf16_weights = bf16_weights and dtype == torch.float32
        self.pack()

    def pack(self) -> None:
        """Reorder the current weights."""
        weight, bias = self.source
        self.bias = bias.detach().to(self.dtype)
        self.weight: Tensor | None = None  # bfloat16 weights: packed at the first wide pass
        self.narrow: tuple[Tensor, Tensor] | None = None  # the C kernel's weights and bias
        if not self.bf16_weights:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(
                weight.detach().to(self.dtype), _TUNED_ROWS)
        elif native.library() is not None:
            packed = native.pack_bf16_weights(weight)
            padded_bias = torch.zeros(packed.numel() // weight.shape[1])
            padded_bias[: bias.numel()] = self.bias
            self.narrow = packed, padded_bias

    def __call__(self, x: Tensor) -> Tensor:
        if self.narrow is not None and x.shape[0] <= _NARROW_ROWS and native.runs_on(x):
            return native.linear_bf16_weights(x, *self.narrow)[:, : self.bias.numel()]
        if self.weight is None:
            rounded = self.source[0].detach().to(torch.bfloat16).float()
            self.weight = torch.ops.mkldnn._reorder_linear_weight(rounded, _TUNED_ROWS)
        return torch.ops.mkldnn._linear_pointwise(
            x.to(self.dtype), self.weight, self.bias, "none", [], "")


class PackedStep:
    """``ActorCritic.forward_step`` on packed weights; call :meth:`pack` after the model's
    weights change."""

    def __init__(self, model: ActorCritic) -> None:
        if not packable(model):
            raise ValueError("PackedStep needs a conv_simple encoder over 'obs' (MLPs beside it) "
                             "and a GRU or no core, on a CPU with oneDNN (and its bfloat16 "
                             "kernels for a bfloat16 encoder)")
        self.model = model
        self.dtype = model.encoder.compute_dtype(_CPU)
        self.branches = model.encoder.branches
        """Every key's branch in the encoder's order; the conv branch ``obs`` runs packed, the
        small MLPs of vector keys eagerly (as under the encoder's autocast)."""
        encoder = model.encoder.main
        assert isinstance(encoder, StackEncoder)
        # (conv, its activation) pairs; each conv's input size from a probe through the stack
        self.convs: list[tuple[_PackedConv, nn.Module]] = []
        x = torch.zeros(_TUNED_ROWS, *encoder.obs_shape)
        with torch.no_grad():
            for conv, activation in zip(encoder.conv[::2], encoder.conv[1::2], strict=True):
                self.convs.append((_PackedConv(conv, list(x.shape), self.dtype), activation))
                x = conv(x)
        fc, self.fc_activation = encoder.fc
        setting = model.cfg.inference_weights
        bf16_weights = setting == "bfloat16" or (setting == "auto"
                                                 and native.library() is not None)
        self.fc = _PackedLinear(fc.weight, fc.bias, self.dtype, bf16_weights)
        self.gru: tuple[_PackedLinear, _PackedLinear] | None = None
        if model.core.rnn is not None:
            rnn = model.core.rnn
            # half the bytes to read in bfloat16: a pass of one or two rows (self-play) is
            # bound by reading the FC's and the GRU's weights
            products = (torch.bfloat16 if precision.uses_bf16(model.core.products_precision, _CPU)
                        else torch.float32)
            self.gru = (_PackedLinear(rnn.weight_ih_l0, rnn.bias_ih_l0, products, bf16_weights),
                        _PackedLinear(rnn.weight_hh_l0, rnn.bias_hh_l0, products, bf16_weights))

    def pack(self) -> None:
        """Reorder every weight again from the model's current (float32) parameters."""
        for layer in (*(conv for conv, _ in self.convs), self.fc, *(self.gru or ())):
            layer.pack()

    def __call__(self, obs: dict[str, Tensor], rnn_state: Tensor, deterministic: bool = False,
                 generator: torch.Generator | None = None,
                 action_mask: Tensor | None = None) -> StepOutput:
        """One step for normalized observations (float images ``obs [B, C, H, W]``, vectors
        under their keys) and ``rnn_state [B, S]``, none of the actions ``action_mask`` masks
        chosen."""
        parts = [self._image_features(obs[key]) if key == "obs" else self._vector_features(
            branch, obs[key]) for key, branch in self.branches.items()]
        features = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        if self.gru is None:
            core_out, state = features.float(), rnn_state
        else:
            core_out = state = self._gru_step(features, rnn_state)
        return self.model.act(core_out, state, deterministic, generator, action_mask)

    def _image_features(self, image: Tensor) -> Tensor:
        """The conv branch on the packed weights, in the encoder's dtype."""
        # Channels-last where the normalization wrote it so (the C kernels: the first conv's
        # fast layout at no cost); NCHW otherwise, as a channels-last copy here cost more than
        # oneDNN's own reorder (~0.3 ms at 8 rows)
        x = image.to(self.dtype)
        for conv, activation in self.convs:
            x = activation(conv(x))
        return self.fc_activation(self.fc(x.flatten(1)))

    def _vector_features(self, branch: nn.Module, vector: Tensor) -> Tensor:
        """A vector key's MLP, as the eager encoder runs it (under its autocast): bfloat16 out
        of a layer, float32 out of an MLP without layers, which the concatenation keeps (it
        promotes, as the eager encoder's does)."""
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16):
            return branch(vector.float())

    def _gru_step(self, x: Tensor, h: Tensor) -> Tensor:
        """``nn.GRU``'s cell on the packed products (as ``Core.sequence`` computes them), the
        gates and state in float32."""
        assert self.gru is not None
        return gru_cell(self.gru[0](x).float(), self.gru[1](h).float(), h)
