"""Sample Factory's model options, each against a reference written from its formula: stacked
GRU / LSTM layers, the decoder MLP, separate actor and critic weights, weight init schemes, the
IMPALA ResNet encoder and obs_subtract_mean / obs_scale."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sfbus_components.models import ActorCritic, ModelConfig
from sfbus_components.models.core import Core, GruCore, LstmCore
from sfbus_components.models.encoders import ResBlock, ResnetImpalaEncoder
from sfbus_components.models.normalizers import ObsNormalizer
from sfbus_components.models.packed import packable
from sfbus_components.models.registry import model_state_size

VECTOR = {"obs": ((6,), "float32")}
HEADS = (3, 2)


def lstm_reference(rnn: nn.LSTM, x: torch.Tensor, h: list[torch.Tensor], c: list[torch.Tensor]
                   ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """One step of a stacked LSTM from the cell equations (Hochreiter & Schmidhuber, with
    torch's gate order i, f, g, o): each layer's h is the next layer's input."""
    h, c = list(h), list(c)
    for k in range(rnn.num_layers):
        w_ih, w_hh = getattr(rnn, f"weight_ih_l{k}"), getattr(rnn, f"weight_hh_l{k}")
        b = getattr(rnn, f"bias_ih_l{k}") + getattr(rnn, f"bias_hh_l{k}")
        i, f, g, o = (x @ w_ih.T + h[k] @ w_hh.T + b).chunk(4, dim=1)
        c[k] = torch.sigmoid(f) * c[k] + torch.sigmoid(i) * torch.tanh(g)
        h[k] = torch.sigmoid(o) * torch.tanh(c[k])
        x = h[k]
    return x, h, c


def gru_reference(rnn: nn.GRU, x: torch.Tensor, h: list[torch.Tensor]
                  ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One step of a stacked GRU from its equations (Cho et al., torch's gate order r, z, n)."""
    h = list(h)
    for k in range(rnn.num_layers):
        gx = x @ getattr(rnn, f"weight_ih_l{k}").T + getattr(rnn, f"bias_ih_l{k}")
        gh = h[k] @ getattr(rnn, f"weight_hh_l{k}").T + getattr(rnn, f"bias_hh_l{k}")
        r = torch.sigmoid(gx[:, :8] + gh[:, :8])
        z = torch.sigmoid(gx[:, 8:16] + gh[:, 8:16])
        n = torch.tanh(gx[:, 16:] + r * gh[:, 16:])
        h[k] = (1 - z) * n + z * h[k]
        x = h[k]
    return x, h


def trajectory(batch: int = 3, steps: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features and dones with resets inside the trajectory (rows end at different steps)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, steps, 5, generator=gen)
    dones = torch.zeros(batch, steps)
    dones[0, 2] = dones[1, 4] = dones[0, 5] = 1.0
    return x, dones


@torch.no_grad()
def test_two_layer_lstm_sequence_equals_the_cell_equations_step_by_step_with_resets() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(core="lstm", core_size=8, rnn_num_layers=2)
    core = LstmCore(5, cfg)
    assert LstmCore.state_size_for(cfg) == 2 * 2 * 8
    x, dones = trajectory()
    state = torch.randn(3, 32)
    out = core.sequence(x, state, dones)
    # the reference: flat state = [h_0, h_1, c_0, c_1]; zeros entering the step after a done
    h, c = list(state[:, :16].chunk(2, dim=1)), list(state[:, 16:].chunk(2, dim=1))
    step_state = state
    for t in range(x.shape[1]):
        if t > 0:
            keep = 1.0 - dones[:, t - 1 : t]
            h, c = [v * keep for v in h], [v * keep for v in c]
            step_state = step_state * keep
        expected, h, c = lstm_reference(core.rnn, x[:, t], h, c)
        torch.testing.assert_close(out[:, t], expected, atol=1e-5, rtol=1e-5)
        step_out, step_state = core.step(x[:, t], step_state)
        torch.testing.assert_close(step_out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(step_state, torch.cat([*h, *c], dim=1), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_two_layer_gru_sequence_equals_the_gru_equations_with_resets() -> None:
    torch.manual_seed(1)
    core = GruCore(5, ModelConfig(core="gru", core_size=8, rnn_num_layers=2))
    x, dones = trajectory()
    state = torch.randn(3, 16)
    out = core.sequence(x, state, dones)
    h = list(state.chunk(2, dim=1))
    for t in range(x.shape[1]):
        if t > 0:
            h = [v * (1.0 - dones[:, t - 1 : t]) for v in h]
        expected, h = gru_reference(core.rnn, x[:, t], h)
        torch.testing.assert_close(out[:, t], expected, atol=1e-5, rtol=1e-5)


def test_state_sizes_grow_with_layers_and_double_with_separate_weights() -> None:
    assert model_state_size(ModelConfig(core="gru", core_size=8, rnn_num_layers=3)) == 24
    assert model_state_size(ModelConfig(core="lstm", core_size=8, rnn_num_layers=2)) == 32
    separate = ModelConfig(core="lstm", core_size=8, rnn_num_layers=2,
                           actor_critic_share_weights=False)
    assert model_state_size(separate) == 64
    assert ActorCritic(VECTOR, HEADS, None, separate).state_size == 64
    assert model_state_size(ModelConfig(core="none", actor_critic_share_weights=False)) == 0


@torch.no_grad()
def test_the_decoder_mlp_sits_between_core_and_heads() -> None:
    torch.manual_seed(2)
    cfg = ModelConfig(core="gru", core_size=8, mlp_layers=(16,), decoder_mlp_layers=(12, 10),
                      nonlinearity="tanh")
    model = ActorCritic(VECTOR, HEADS, None, cfg)
    obs = {"obs": torch.randn(4, 6)}
    state = torch.randn(4, 8)
    out = model.forward_step(obs, state, deterministic=True)
    core_out, _ = model.core.step(model.encoder(obs), state)
    linears = [m for m in model.decoder if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(8, 12), (12, 10)]
    decoded = torch.tanh(linears[1](torch.tanh(linears[0](core_out))))
    torch.testing.assert_close(out.action_logits, model.actor(decoded))
    torch.testing.assert_close(out.value, model.critic(decoded).squeeze(-1))


def test_separate_weights_keep_actor_and_critic_apart() -> None:
    torch.manual_seed(3)
    cfg = ModelConfig(core="lstm", core_size=8, mlp_layers=(16,), decoder_mlp_layers=(8,),
                      actor_critic_share_weights=False)
    model = ActorCritic(VECTOR, HEADS, None, cfg)
    _, dones = trajectory(steps=7)
    obs = {"obs": torch.randn(3, 7, 6)}
    state = torch.randn(3, model.state_size)
    dist, values = model.forward_sequence(obs, state, dones)
    actor_parts = [model.encoder, model.core, model.decoder, model.actor]
    critic_parts = [model.critic_encoder, model.critic_core, model.critic_decoder, model.critic]
    value_grads = torch.autograd.grad(values.sum(), [p for m in actor_parts + critic_parts
                                                     for p in m.parameters()], allow_unused=True)
    n_actor = sum(1 for m in actor_parts for _ in m.parameters())
    assert all(g is None or not g.any() for g in value_grads[:n_actor])  # the value: critic only
    assert all(g is not None and g.any() for g in value_grads[n_actor:])
    logp = dist.log_prob(torch.zeros(3, 7, 2, dtype=torch.int64)).sum()
    policy_grads = torch.autograd.grad(logp, [p for m in critic_parts for p in m.parameters()],
                                       allow_unused=True)
    assert all(g is None or not g.any() for g in policy_grads)
    # the flat state: the actor's half, then the critic's; stepping equals the sequence
    with torch.no_grad():
        step_state = state
        for t in range(7):
            if t > 0:
                step_state = step_state * (1.0 - dones[:, t - 1 : t])
            out = model.forward_step({"obs": obs["obs"][:, t]}, step_state, deterministic=True)
            step_state = out.rnn_state
            torch.testing.assert_close(out.value, values[:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.action_logits, dist.params[:, t], atol=1e-5,
                                       rtol=1e-5)


def hidden_linears(model: ActorCritic) -> list[nn.Linear]:
    return [m for m in (*model.encoder.modules(), *model.decoder.modules())
            if isinstance(m, nn.Linear)]


def test_orthogonal_init_gives_orthogonal_rows_with_gain_sqrt2() -> None:
    model = ActorCritic(VECTOR, HEADS, None, ModelConfig(core="gru", core_size=8,
                                                          mlp_layers=(16, 8)))
    for layer in hidden_linears(model):
        w = layer.weight
        rows, cols = w.shape
        gram = w @ w.T if rows <= cols else w.T @ w
        torch.testing.assert_close(gram, 2.0 * torch.eye(min(rows, cols)), atol=1e-5, rtol=0)
        assert not layer.bias.any()
    w = model.core.rnn.weight_hh_l0  # [3H, H]: orthogonal columns, gain 1
    torch.testing.assert_close(w.T @ w, torch.eye(8), atol=1e-5, rtol=0)


def test_policy_init_gain_is_sample_factorys_scheme() -> None:
    gain = 0.5
    model = ActorCritic(VECTOR, HEADS, None, ModelConfig(core="gru", core_size=8,
                                                          mlp_layers=(16, 8),
                                                          policy_init_gain=gain))
    for layer in [*hidden_linears(model), model.actor, model.critic]:
        w = layer.weight
        rows, cols = w.shape
        gram = w @ w.T if rows <= cols else w.T @ w
        torch.testing.assert_close(gram, gain**2 * torch.eye(min(rows, cols)), atol=1e-5, rtol=0)
    # the GRU keeps torch's init: uniform within 1 / sqrt(hidden), biases too, not orthogonal
    bound = 1.0 / math.sqrt(8)
    for param in model.core.rnn.parameters():
        assert param.abs().max() <= bound and param.abs().max() > 0.5 * bound
    w = model.core.rnn.weight_hh_l0
    assert not torch.allclose(w.T @ w, torch.eye(8), atol=1e-2)
    with pytest.raises(ValueError, match="torch_default has no gain"):
        ModelConfig(policy_initialization="torch_default", policy_init_gain=1.0)
    with pytest.raises(ValueError, match="policy_init_gain must be > 0"):
        ModelConfig(policy_init_gain=0.0)


def test_xavier_uniform_and_torch_default_init_have_their_bounds() -> None:
    torch.manual_seed(4)
    xavier = ActorCritic({"obs": ((200,), "float32")}, HEADS, None,
                         ModelConfig(core="none", mlp_layers=(300,),
                                     policy_initialization="xavier_uniform"))
    (layer,) = hidden_linears(xavier)
    bound = math.sqrt(2.0) * math.sqrt(6.0 / (200 + 300))  # gain * sqrt(6 / (fan_in + fan_out))
    assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.99 * bound
    assert abs(layer.weight.var().item() - bound**2 / 3) < 0.05 * bound**2  # uniform's variance
    default = ActorCritic({"obs": ((200,), "float32")}, HEADS, None,
                          ModelConfig(core="none", mlp_layers=(300,),
                                      policy_initialization="torch_default"))
    (layer,) = hidden_linears(default)
    bound = 1.0 / math.sqrt(200)  # kaiming_uniform(a=sqrt(5)): 1 / sqrt(fan_in)
    assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.99 * bound
    assert not layer.bias.any()  # Sample Factory zeroes every bias


def test_resnet_impala_has_the_impala_layout() -> None:
    cfg = ModelConfig(encoder="resnet_impala", hidden=32)
    encoder = ResnetImpalaEncoder((3, 64, 64), cfg)
    convs = [m for m in encoder.conv.modules() if isinstance(m, nn.Conv2d)]
    assert [m.out_channels for m in convs] == [16] * 5 + [32] * 10
    assert all(m.kernel_size == (3, 3) and m.stride == (1, 1) for m in convs)
    # three 3x3/2 max-pools with padding 1: 64 -> 32 -> 16 -> 8
    assert encoder.conv(torch.zeros(1, 3, 64, 64)).shape == (1, 32, 8, 8)
    assert encoder.fc[0].in_features == 32 * 8 * 8 and encoder.out_size == 32
    block = ResBlock(4, "relu")
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        conv1, conv2 = block.body[1], block.body[3]
        expected = x + conv2(torch.relu(conv1(torch.relu(x))))
        torch.testing.assert_close(block(x), expected)
    model = ActorCritic({"obs": ((3, 64, 64), "uint8")}, HEADS, None, cfg)
    assert not packable(model)
    out = model.forward_step({"obs": torch.zeros(2, 3, 64, 64, dtype=torch.uint8)},
                             model.initial_state(2))
    assert out.value.shape == (2,)


@pytest.mark.parametrize("cfg", [
    ModelConfig(core="lstm", core_size=8),
    ModelConfig(core="gru", core_size=8, rnn_num_layers=2),
    ModelConfig(core="gru", core_size=8, actor_critic_share_weights=False),
], ids=["lstm", "gru2", "separate"])
def test_what_the_packed_path_cannot_run_goes_to_the_eager_model(cfg: ModelConfig) -> None:
    model = ActorCritic({"obs": ((3, 72, 128), "uint8")}, HEADS, None, cfg)
    assert isinstance(model.core, Core) and not packable(model)


def test_obs_subtract_mean_and_scale_without_running_normalization() -> None:
    spec = {"obs": ((3, 4, 4), "uint8"), "other": ((2,), "float32")}
    norm = ObsNormalizer(spec, running=False, subtract_mean=128.0, scale=128.0).train()
    x = torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8)
    other = torch.randn(5, 2)
    out = norm({"obs": x, "other": other})
    torch.testing.assert_close(out["obs"], (x.float() - 128.0) / 128.0)
    assert out["other"] is other  # Sample Factory applies them to `obs` only
    out = norm({"obs": x, "other": other})  # training mode does not move a fixed map
    torch.testing.assert_close(out["obs"], (x.float() - 128.0) / 128.0)


def test_obs_scale_sets_the_units_of_running_statistics() -> None:
    spec = {"obs": ((3,), "float32")}
    norm = ObsNormalizer(spec, running=True, scale=10.0)
    x = torch.randn(1000, 3) * 20 + 50
    norm.stats["obs"].update(x)
    scaled = x.double() / 10.0
    torch.testing.assert_close(norm.stats["obs"].mean, scaled.mean(0))
    torch.testing.assert_close(norm.stats["obs"].var, scaled.var(0, correction=0))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"obs_scale": 0.0}, "obs_scale must be > 0"),
    ({"obs_subtract_mean": 128.0}, "obs_subtract_mean has no effect with normalize_input"),
    ({"rnn_num_layers": 0}, "rnn_num_layers must be >= 1"),
    ({"decoder_mlp_layers": (8, 0)}, "decoder_mlp_layers: every layer width must be >= 1"),
])
def test_bad_values_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)
