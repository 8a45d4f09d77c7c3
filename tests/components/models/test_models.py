"""ActorCritic shapes, RNN reset semantics, action distributions and gradient flow."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributions import Categorical, Normal

from sfbus_components.models import ActionDistribution, ActorCritic, ModelConfig
from sfbus_components.models.core import GruCore
from sfbus_components.models.precision import cpu_has_fast_bf16, onednn_has_bf16

IMAGE = ((3, 72, 128), "uint8")
HEADS = (3, 3, 2, 2, 2, 8, 21)  # Table A.4


def make_model(arch: str, core: str, gaussian: bool = False) -> tuple[ActorCritic, dict]:
    """A small model (narrow core) for architecture `arch`: simplified / full / mlp."""
    if arch == "mlp":
        spec = {"obs": ((6,), "float32")}
    elif arch == "full":
        spec = {"obs": IMAGE, "measurements": ((5,), "float32")}
    else:
        spec = {"obs": IMAGE}
    cfg = ModelConfig(
        architecture="full" if arch == "full" else "simplified",
        core=core,
        hidden=64,
        core_size=16,
        measurements_hidden=(8,),
        mlp_layers=(16, 16),
        precision="float32",  # exact comparisons; bfloat16 has its own test
    )
    heads, dim = (None, 2) if gaussian else (HEADS, None)
    return ActorCritic(spec, heads, dim, cfg), spec


def random_obs(spec: dict, *lead: int) -> dict[str, torch.Tensor]:
    """Random observations with leading dims `lead`."""
    obs = {}
    for key, (shape, dtype) in spec.items():
        if dtype == "uint8":
            obs[key] = torch.randint(0, 256, (*lead, *shape), dtype=torch.uint8)
        else:
            obs[key] = torch.randn(*lead, *shape)
    return obs


@pytest.mark.parametrize("core", ["gru", "lstm", "none"])
@pytest.mark.parametrize("arch", ["simplified", "full", "mlp"])
def test_output_shapes(arch, core):
    torch.manual_seed(0)
    model, spec = make_model(arch, core)
    state_size = {"gru": 16, "lstm": 32, "none": 0}[core]
    assert model.state_size == state_size
    out = model.forward_step(random_obs(spec, 4), model.initial_state(4))
    assert out.actions.shape == (4, len(HEADS)) and out.actions.dtype == torch.int64
    assert out.log_prob.shape == (4,) and out.value.shape == (4,)
    assert out.rnn_state.shape == (4, state_size)
    assert out.action_logits.shape == (4, sum(HEADS))
    assert all((out.actions[:, i] < n).all() for i, n in enumerate(HEADS))
    dist, values = model.forward_sequence(
        random_obs(spec, 2, 5), model.initial_state(2), torch.zeros(2, 5)
    )
    assert values.shape == (2, 5)
    assert dist.log_prob(torch.zeros(2, 5, len(HEADS), dtype=torch.long)).shape == (2, 5)
    assert dist.entropy().shape == (2, 5)


def test_gaussian_shapes_and_mode():
    model, spec = make_model("mlp", "gru", gaussian=True)
    obs, state = random_obs(spec, 3), model.initial_state(3)
    out = model.forward_step(obs, state)
    assert out.actions.shape == (3, 2) and out.actions.dtype == torch.float32
    det = model.forward_step(obs, state, deterministic=True)
    torch.testing.assert_close(det.actions, det.action_logits[:, :2])  # the mode: the mean


def test_full_architecture_uses_measurements():
    torch.manual_seed(0)
    model, spec = make_model("full", "none")
    obs = random_obs(spec, 2)
    a = model.forward_step(obs, model.initial_state(2)).value
    obs["measurements"] = obs["measurements"] + 1.0
    b = model.forward_step(obs, model.initial_state(2)).value
    assert not torch.allclose(a, b)


def test_uint8_images_are_scaled_inside_the_model():
    torch.manual_seed(0)
    model, spec = make_model("simplified", "none")
    image = random_obs(spec, 2)["obs"]
    features = model.encoder({"obs": image})
    torch.testing.assert_close(features, model.encoder.main(image.float() / 255.0))


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_sequence_resets_like_step_by_step(core):
    torch.manual_seed(0)
    model, spec = make_model("mlp", core)
    batch, steps = 3, 7
    obs = random_obs(spec, batch, steps)
    start = torch.randn(batch, model.state_size)
    dones = torch.zeros(batch, steps)
    dones[0, 2] = 1.0  # trajectories end at different steps, one never, one twice
    dones[1, 0] = dones[1, 4] = 1.0
    dones[:, -1] = 1.0  # the last column must not matter
    actions = torch.stack([torch.randint(0, n, (batch, steps)) for n in HEADS], dim=-1)

    dist, values = model.forward_sequence(obs, start, dones)

    state = start
    for t in range(steps):
        out = model.forward_step({k: v[:, t] for k, v in obs.items()}, state)
        torch.testing.assert_close(values[:, t], out.value, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dist.params[:, t], out.action_logits, rtol=1e-5, atol=1e-5)
        step_dist = ActionDistribution(logits=out.action_logits, action_heads=HEADS)
        torch.testing.assert_close(
            dist.log_prob(actions)[:, t], step_dist.log_prob(actions[:, t]), rtol=1e-5, atol=1e-5
        )
        # the rollout worker's rule: a new episode starts from a zero state
        state = out.rnn_state * (1.0 - dones[:, t : t + 1])

    # without the resets the outputs differ, so the comparison above is not vacuous
    _, values_no_reset = model.forward_sequence(obs, start, torch.zeros(batch, steps))
    assert not torch.allclose(values_no_reset, values)


def test_multi_head_log_prob_and_entropy_are_sums_over_heads():
    torch.manual_seed(0)
    logits = torch.randn(4, 5, sum(HEADS))
    dist = ActionDistribution(logits=logits, action_heads=HEADS)
    actions = dist.sample()
    assert actions.shape == (4, 5, len(HEADS))
    heads = [Categorical(logits=h) for h in logits.split(list(HEADS), dim=-1)]
    log_prob = sum(h.log_prob(actions[..., i]) for i, h in enumerate(heads))
    entropy = sum(h.entropy() for h in heads)
    torch.testing.assert_close(dist.log_prob(actions), log_prob)
    torch.testing.assert_close(dist.entropy(), entropy)
    torch.testing.assert_close(dist[:, 1:3].log_prob(actions[:, 1:3]), log_prob[:, 1:3])
    kl = sum(
        torch.distributions.kl_divergence(h, Categorical(logits=h.logits.flip(-1))) for h in heads
    )
    flipped = torch.cat([h.flip(-1) for h in logits.split(list(HEADS), dim=-1)], dim=-1)
    other = ActionDistribution(logits=flipped, action_heads=HEADS)
    torch.testing.assert_close(dist.kl(other), kl)


def test_heads_of_different_sizes_sample_their_own_probabilities_in_one_draw():
    """All heads are drawn at once from a padded table: no head may ever draw a padding index,
    each head's frequencies follow its own softmax, the mode is each head's argmax, and the
    gradient reaches the logits exactly as through per-head log-softmaxes; the draws are
    torch.multinomial's from the same generator."""
    torch.manual_seed(1)
    logits = torch.randn(sum(HEADS)) * 2
    batch = ActionDistribution(logits=logits.expand(20000, -1), action_heads=HEADS)
    draws = batch.sample(torch.Generator().manual_seed(0))
    table = batch.head_log_probs.exp().reshape(-1, max(HEADS))
    assert torch.equal(draws, torch.multinomial(
        table, 1, generator=torch.Generator().manual_seed(0)).reshape(draws.shape))
    dist = ActionDistribution(logits=logits, action_heads=HEADS)
    for head, (choices, head_logits) in enumerate(zip(HEADS, logits.split(list(HEADS)),
                                                  strict=True)):
        assert int(draws[:, head].max()) < choices
        counts = torch.bincount(draws[:, head], minlength=choices).float() / len(draws)
        torch.testing.assert_close(counts, head_logits.softmax(-1), atol=0.015, rtol=0)
        assert int(dist.mode()[head]) == int(head_logits.argmax())
    # a head whose every action is masked still draws one of its own actions, never padding
    mask = torch.ones(sum(HEADS))
    mask[:3] = 0
    masked = ActionDistribution(logits=logits.expand(500, -1), action_heads=HEADS,
                                action_mask=mask.expand(500, -1))
    assert int(masked.sample().max(0).values[0]) < HEADS[0]
    leaf = logits.clone().requires_grad_()
    actions = draws[:8]
    ActionDistribution(logits=leaf.expand(8, -1), action_heads=HEADS).log_prob(
        actions).sum().backward()
    reference = logits.clone().requires_grad_()
    sum(Categorical(logits=h.expand(8, -1)).log_prob(actions[:, i]).sum()
        for i, h in enumerate(reference.split(list(HEADS)))).backward()
    torch.testing.assert_close(leaf.grad, reference.grad)


def test_heads_first_drawn_in_inference_mode_still_train():
    """The padding layout is built once per head sizes; built inside an inference step (as in a
    process that acts, then trains), it must still be usable by autograd afterwards."""
    heads = (4, 1, 6)  # sizes no other test uses, so the layout is first built here
    with torch.inference_mode():
        ActionDistribution(logits=torch.randn(2, sum(heads)), action_heads=heads).sample()
    logits = torch.randn(2, sum(heads), requires_grad=True)
    dist = ActionDistribution(logits=logits, action_heads=heads)
    dist.log_prob(dist.sample()).sum().backward()
    assert logits.grad is not None and bool(logits.grad.abs().sum() > 0)


def test_gaussian_log_prob_entropy_match_torch():
    mean, log_std = torch.randn(4, 3), torch.randn(3)
    dist = ActionDistribution(mean=mean, log_std=log_std)
    ref = Normal(mean, log_std.exp())
    actions = dist.sample()
    torch.testing.assert_close(dist.log_prob(actions), ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(), ref.entropy().sum(-1))
    torch.testing.assert_close(dist.mode(), mean)


def test_deterministic_mode_is_argmax_per_head():
    torch.manual_seed(0)
    model, spec = make_model("mlp", "gru")
    obs, state = random_obs(spec, 5), model.initial_state(5)
    a = model.forward_step(obs, state, deterministic=True)
    b = model.forward_step(obs, state, deterministic=True)
    torch.testing.assert_close(a.actions, b.actions)
    expected = torch.stack([h.argmax(-1) for h in a.action_logits.split(list(HEADS), -1)], -1)
    torch.testing.assert_close(a.actions, expected)


@pytest.mark.parametrize("core", ["gru", "lstm"])
@pytest.mark.parametrize("gaussian", [False, True])
def test_gradient_reaches_every_parameter(core, gaussian):
    torch.manual_seed(0)
    model, spec = make_model("full", core, gaussian=gaussian)
    obs = random_obs(spec, 2, 3)
    dist, values = model.forward_sequence(obs, model.initial_state(2), torch.zeros(2, 3))
    actions = dist.sample()
    loss = values.sum() + dist.log_prob(actions).sum() + dist.entropy().sum()
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_an_action_space_is_needed():
    """Neither heads nor a Box is refused (both is a hybrid action, test_hybrid_actions.py)."""
    message = r"give action_heads \(categorical\), action_dim \(Box\) or both \(hybrid\)"
    with pytest.raises(ValueError, match=message):
        ActorCritic({"obs": ((4,), "float32")}, None, None, ModelConfig())


def test_bfloat16_encoder_matches_float32_and_keeps_float32_outputs_and_grads() -> None:
    torch.manual_seed(0)
    spec = {"obs": IMAGE}
    exact = ActorCritic(spec, (3,), None, ModelConfig(hidden=64, core_size=16,
                                                      precision="float32"))
    fast = ActorCritic(spec, (3,), None, ModelConfig(hidden=64, core_size=16,
                                                     precision="bfloat16"))
    fast.load_state_dict(exact.state_dict())
    obs, state = random_obs(spec, 8), torch.zeros(8, 16)
    features = {m: model.encoder(obs) for m, model in (("exact", exact), ("fast", fast))}
    assert features["fast"].dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: close to float32, but not bit-identical
    assert not torch.equal(features["fast"], features["exact"])
    torch.testing.assert_close(features["fast"], features["exact"], atol=0.05, rtol=0.05)
    out = fast.forward_step(obs, state)
    assert out.value.dtype == out.rnn_state.dtype == out.action_logits.dtype == torch.float32
    dist, values = fast.forward_sequence(random_obs(spec, 2, 4), state[:2], torch.zeros(2, 4))
    (values.sum() + dist.params.sum()).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.isfinite().all()
               for p in fast.parameters())


@pytest.mark.parametrize("layers", [1, 2])
def test_the_cpu_gru_sequence_has_nn_gru_outputs_and_gradients_across_resets(layers: int) -> None:
    """The CPU's GRU (one pass with no cut at the resets, its backward written out) against
    ``nn.GRU`` run stretch by stretch between the resets, the state multiplied by ``keep``."""
    torch.manual_seed(0)
    core = GruCore(24, ModelConfig(core_size=32, rnn_num_layers=layers))
    x = torch.randn(4, 9, 24, requires_grad=True)
    start = torch.randn(4, core.state_size, requires_grad=True)
    dones = torch.zeros(4, 9)
    dones[1, 3] = dones[3, 0] = dones[3, 6] = 1.0
    out = core.sequence(x, start, dones)
    grads = torch.autograd.grad(out.square().sum(), [x, start, *core.parameters()])

    keep = 1.0 - dones
    state = start.reshape(4, layers, 32).transpose(0, 1)
    pieces = []
    for first, end in [(0, 1), (1, 4), (4, 7), (7, 9)]:  # cut after each step that ended one
        if first > 0:
            state = state * keep[:, first - 1 : first]
        piece, state = core.rnn(x[:, first:end], state)
        pieces.append(piece)
    expected = torch.cat(pieces, dim=1)
    expected_grads = torch.autograd.grad(expected.square().sum(),
                                         [x, start, *core.parameters()])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layers", [1, 2])
def test_gru_products_in_bfloat16_follow_the_float32_gru(layers: int) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(core_size=32, rnn_num_layers=layers)
    core = GruCore(24, cfg)
    x = torch.randn(4, 9, 24, requires_grad=True)
    start = torch.randn(4, core.state_size)
    dones = torch.zeros(4, 9)
    dones[1, 3] = dones[3, 0] = dones[3, 6] = 1.0

    def run(precision: str, episode_ends: torch.Tensor) -> tuple[torch.Tensor, list]:
        core.products_precision = precision
        core.zero_grad()
        x.grad = None
        out = core.sequence(x, start, episode_ends)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in (*core.parameters(), x)]

    exact, exact_grads = run("float32", dones)
    fast, fast_grads = run("bfloat16", dones)
    assert fast.dtype == torch.float32 and not torch.equal(fast, exact)
    torch.testing.assert_close(fast, exact, atol=0.02, rtol=0.02)
    for grad, exact_grad in zip(fast_grads, exact_grads, strict=True):
        assert grad.dtype == torch.float32
        assert (grad - exact_grad).norm() < 0.02 * exact_grad.norm()
    # the resets count: without them the bfloat16 path's outputs move far more than rounding
    no_resets, _ = run("bfloat16", torch.zeros(4, 9))
    assert (no_resets - exact).abs().max() > 0.1


def test_a_built_in_core_computes_its_products_as_the_encoder() -> None:
    image = ActorCritic({"obs": IMAGE}, (3,), None,
                        ModelConfig(hidden=8, core_size=4, precision="bfloat16"))
    vector = ActorCritic({"obs": ((6,), "float32")}, (3,), None, ModelConfig(core_size=4))
    separate = ActorCritic({"obs": IMAGE}, (3,), None, ModelConfig(
        hidden=8, core_size=4, precision="bfloat16", actor_critic_share_weights=False))
    assert image.core.products_precision == "bfloat16"
    assert vector.core.products_precision == "float32"
    assert separate.critic_core.products_precision == "bfloat16"


def test_auto_precision_uses_bfloat16_only_for_images_on_fast_hardware() -> None:

    image = ActorCritic({"obs": IMAGE}, (3,), None, ModelConfig(hidden=8, core_size=4))
    vector = ActorCritic({"obs": ((6,), "float32")}, (3,), None, ModelConfig(core_size=4))
    assert image.encoder.precision == "auto"
    assert vector.encoder.precision == "float32"
    cpu = torch.device("cpu")
    from sfbus_components.models.precision import uses_bf16

    assert uses_bf16("auto", cpu) == (cpu_has_fast_bf16() and onednn_has_bf16())
    assert uses_bf16("bfloat16", cpu) and not uses_bf16("float32", cpu)


def test_auto_precision_is_float32_where_onednn_may_not_use_bfloat16() -> None:
    # ONEDNN_MAX_CPU_ISA=AVX2 leaves oneDNN what an AVX2-only CPU has: `auto` must not pick
    # bfloat16 there, whatever /proc/cpuinfo lists (the emulated AVX2 benchmarks rely on it)
    probe = ("import torch; from sfbus_components.models.precision import uses_bf16; "
             "print(uses_bf16('auto', torch.device('cpu')))")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == "False"


def test_inference_weights_kept_in_bfloat16_give_the_same_actions_as_casting_them() -> None:
    torch.manual_seed(1)
    spec = {"obs": IMAGE}
    cast = ActorCritic(spec, (3,), None, ModelConfig(hidden=32, core_size=8,
                                                     precision="bfloat16")).eval()
    stored = ActorCritic(spec, (3,), None, ModelConfig(hidden=32, core_size=8,
                                                       precision="bfloat16")).eval()
    stored.load_state_dict(cast.state_dict())
    stored.encoder.keep_weights_in_compute_dtype(torch.device("cpu"))
    assert {p.dtype for p in stored.encoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in stored.core.parameters()} == {torch.float32}
    obs = random_obs(spec, 4)
    with torch.inference_mode():
        a = cast.forward_step(obs, torch.zeros(4, 8), deterministic=True)
        b = stored.forward_step(obs, torch.zeros(4, 8), deterministic=True)
    # autocast casts each float32 weight to bfloat16 on use: the same numbers as stored ones
    torch.testing.assert_close(a.action_logits, b.action_logits)
    torch.testing.assert_close(a.value, b.value)


def _packed_pair(core: str, nonlinearity: str, architecture: str) -> tuple[ActorCritic, dict]:
    """A float32 reference model and the spec; the packed step runs a copy of it."""
    torch.manual_seed(2)
    # two keys, the vector first: `auto` concatenates the features in this order, `full` as
    # obs, measurements; the packed step must follow either
    spec = {"obs": IMAGE} if architecture == "simplified" else \
        {"measurements": ((5,), "float32"), "obs": IMAGE}
    # `full`'s measurements through an MLP, `auto`'s vector key through none (the identity)
    cfg = ModelConfig(hidden=64, core=core, core_size=32, precision="float32",
                      nonlinearity=nonlinearity, architecture=architecture,
                      measurements_hidden=(8,), mlp_layers=())
    return ActorCritic(spec, (3, 5), None, cfg).eval(), spec


@pytest.mark.parametrize("precision", [
    "float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
        not onednn_has_bf16(), reason="a bfloat16 packed step needs oneDNN's bf16 kernels "
        "(AVX-512 or AMX)"))])
@pytest.mark.parametrize(("core", "nonlinearity", "architecture"), [
    ("gru", "elu", "simplified"), ("none", "elu", "simplified"), ("gru", "relu", "simplified"),
    ("gru", "tanh", "simplified"), ("gru", "elu", "full"), ("none", "elu", "full"),
    ("gru", "elu", "auto")])
def test_packed_step_matches_the_learners_arithmetic_and_follows_new_weights(
        core: str, nonlinearity: str, architecture: str, precision: str) -> None:
    from sfbus_components.models.packed import PackedStep

    reference, spec = _packed_pair(core, nonlinearity, architecture)
    fast = ActorCritic(spec, (3, 5), None, dataclasses.replace(
        reference.cfg, precision=precision, inference_weights="float32")).eval()
    fast.load_state_dict(reference.state_dict())
    packed = PackedStep(fast)
    obs = {"obs": torch.rand(6, *IMAGE[0]) * 2 - 1,  # as normalized images are
           "measurements": torch.randn(6, 5)}
    state = torch.randn(6, reference.state_size) * 0.5

    def compare() -> None:
        with torch.inference_mode():
            exact = reference.forward_step(obs, state, deterministic=True)
            # the learner's forward over one step: the numbers the PPO ratio divides by
            learner, learner_value = fast.forward_sequence(
                {key: value.unsqueeze(1) for key, value in obs.items()}, state, torch.zeros(6, 1))
            learner_state = fast.core.sequence(fast.encoder(obs).unsqueeze(1), state,
                                               torch.zeros(6, 1))[:, 0] if core == "gru" else state
            got = packed(obs, state, deterministic=True)
        # only the weights' layout moved (the GRU's bfloat16 products are rounded to bfloat16 in
        # both, so a last-bit difference in an accumulation may show, far below the ~2e-3 that
        # float32 products would differ by here)
        tolerance = 1e-4 if precision == "float32" else 4e-4
        for name, learners in (("action_logits", learner.params[:, 0]),
                               ("value", learner_value[:, 0]), ("rnn_state", learner_state)):
            torch.testing.assert_close(getattr(got, name), learners.float(),
                                       atol=tolerance, rtol=tolerance)
            # and the float32 model's, to bfloat16's ~3 significant digits where it computes so
            tolerance_32 = 1e-4 if precision == "float32" else 0.05
            torch.testing.assert_close(getattr(got, name), getattr(exact, name),
                                       atol=tolerance_32, rtol=tolerance_32)
        assert got.rnn_state.dtype == torch.float32

    compare()
    with torch.no_grad():  # new weights, as a refresh copies them in: pack() must pick them up
        for p in [*reference.parameters()]:
            p.add_(torch.randn_like(p) * 0.05)
    fast.load_state_dict(reference.state_dict())
    packed.pack()
    compare()


@pytest.mark.parametrize("core", ["gru", "none"])
def test_packed_step_over_bfloat16_weights_is_the_model_with_those_weights_rounded(
        core: str) -> None:
    from sfbus_components.models import native
    from sfbus_components.models.packed import PackedStep

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as inference workers run: the C kernel's condition
    try:
        reference, spec = _packed_pair(core, "elu", "full")
        fast = ActorCritic(spec, (3, 5), None, dataclasses.replace(
            reference.cfg, inference_weights="bfloat16")).eval()
        fast.load_state_dict(reference.state_dict())
        packed = PackedStep(fast)
        rounded = copy.deepcopy(reference)  # the FC's and the GRU's weights, not their biases
        layers = [rounded.encoder.main.fc[0].weight]
        if core == "gru":
            layers += [rounded.core.rnn.weight_ih_l0, rounded.core.rnn.weight_hh_l0]

        def compare(rows: int) -> float:
            """Max distance to the rounded model (asserted ~float32's); to the float32 one."""
            gen = torch.Generator().manual_seed(rows)
            obs = {"obs": torch.rand(rows, *IMAGE[0], generator=gen) * 2 - 1,
                   "measurements": torch.randn(rows, 5, generator=gen)}
            state = torch.randn(rows, reference.state_size, generator=gen) * 0.5
            with torch.no_grad():
                for weight in layers:
                    weight.copy_(weight.to(torch.bfloat16))
            with torch.inference_mode():
                got = packed(obs, state, deterministic=True)
                want = rounded.forward_step(obs, state, deterministic=True)
                exact = reference.forward_step(obs, state, deterministic=True)
            for name in ("action_logits", "value", "rnn_state"):
                torch.testing.assert_close(getattr(got, name), getattr(want, name),
                                           atol=2e-5, rtol=2e-5)
            return max((getattr(got, name) - getattr(exact, name)).abs().max().item()
                       for name in ("action_logits", "value"))

        # a few rows through the C kernel where it is built, many through oneDNN: both on the
        # rounded weights, and far from the float32 model's numbers (the rounding happened)
        assert (packed.fc.narrow is not None) == (native.library() is not None)
        assert min(compare(2), compare(40)) > 1e-4
        with torch.no_grad():  # a refresh: both paths must take the new weights
            for p in reference.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        fast.load_state_dict(reference.state_dict())
        rounded.load_state_dict(reference.state_dict())
        packed.pack()
        assert min(compare(40), compare(1)) > 1e-4
    finally:
        torch.set_num_threads(threads)


def test_nature_cnn_on_an_atari_frame_stack() -> None:
    from sfbus_components.models.encoders import StackEncoder
    from sfbus_components.models.parts import build_encoder

    cfg = ModelConfig(encoder="nature_cnn", nonlinearity="relu", precision="float32")
    encoder = build_encoder({"obs": ((4, 84, 84), "uint8")}, cfg)
    assert isinstance(encoder.main, StackEncoder) and encoder.main.stack == "nature_cnn"
    convs = [m for m in encoder.main.conv if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))]
    assert encoder.main.fc[0].in_features == 64 * 7 * 7  # 84 -> 20 -> 9 -> 7
    assert isinstance(encoder.main.fc[1], torch.nn.ReLU)
    out = encoder({"obs": torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)})
    assert out.shape == (5, 512) and encoder.out_size == 512 and out.dtype == torch.float32


@pytest.mark.parametrize("onednn_bf16", [True, False])
def test_packable_only_for_the_conv_encoder_with_a_gru_or_no_core(
        monkeypatch: pytest.MonkeyPatch, onednn_bf16: bool) -> None:
    from sfbus_components.models import precision
    from sfbus_components.models.packed import packable

    # Both kinds of CPU on any machine: oneDNN's bf16 kernels need AVX-512 or AMX.
    monkeypatch.setattr(precision, "onednn_has_bf16", lambda: onednn_bf16)

    def model(**kwargs: object) -> ActorCritic:
        spec = {"obs": IMAGE, "measurements": ((5,), "float32")} \
            if kwargs.get("architecture") == "full" else {"obs": IMAGE}
        cfg = ModelConfig(hidden=16, core_size=8, **{"precision": "bfloat16", **kwargs})
        return ActorCritic(spec, (3,), None, cfg)

    assert packable(model()) == onednn_bf16
    assert packable(model(core="none")) == onednn_bf16
    assert not packable(model(core="lstm"))
    assert not packable(model(encoder="nature_cnn"))  # the packed path knows conv_simple only
    assert packable(model(architecture="full")) == onednn_bf16  # MLPs beside the conv stack
    assert packable(model(precision="float32"))  # oneDNN's float32 kernels: every CPU
    assert not packable(ActorCritic({"obs": ((6,), "float32")}, (3,), None, ModelConfig()))


@pytest.mark.parametrize("change", [{"mlp_layers": (64, 0)}, {"measurements_hidden": (-1,)},
                                    {"hidden": 0}, {"core_size": 0}])
def test_a_layer_without_width_is_refused(change: dict) -> None:
    with pytest.raises(ValueError, match=r"must be >= 1, got"):
        ModelConfig(**change)


def test_convnet_impala_is_impalas_shallow_stack() -> None:
    from sfbus_components.models.parts import build_encoder

    cfg = ModelConfig(encoder="convnet_impala", hidden=256, precision="float32")
    encoder = build_encoder({"obs": ((3, 72, 128), "uint8")}, cfg)
    convs = [m for m in encoder.main.conv if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (3, 16, (8, 8), (4, 4)), (16, 32, (4, 4), (2, 2))]
    # 72x128 -> 17x31 -> 7x14 maps of 32 channels into the FC layer
    assert encoder.main.fc[0].in_features == 32 * 7 * 14 and encoder.out_size == 256
