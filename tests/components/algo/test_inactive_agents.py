"""Inactive agents (a multi-agent env's ``is_active``): their steps are stored as inactive and
masked out of the loss, while still feeding V-trace's recursion as masked steps do."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sfbus_components.algo import AppoConfig, appo_loss
from sfbus_components.learning.population_member import PopulationMember
from sfbus_components.models import ActorCritic
from sfbus_components.models.config import ModelConfig

ROOT = Path(__file__).parents[3]


def _grads(model: ActorCritic, batch: dict, valids: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    loss, _ = appo_loss(model, {**batch, "valids": valids},
                        AppoConfig(normalize_returns=False, kl_loss_coeff=0.3))
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_inactive_steps_change_nothing_in_the_gradient() -> None:
    """A hand-built batch: an agent that left at step 3 (terminated there) is inactive from
    step 4; whatever its inactive steps hold, the loss's gradient is the same, and it differs
    from the gradient with those steps counted."""
    torch.manual_seed(0)
    b, t = 4, 8
    model = ActorCritic({"obs": ((3,), "float32")}, (3,), None,
                        ModelConfig(core="none", mlp_layers=(16,)))
    active = torch.ones(b, t + 1, dtype=torch.uint8)
    active[1, 4:] = 0
    active[3, 6:] = 0
    dones = torch.zeros(b, t)
    dones[1, 3:] = 1  # the leaving step, then one-step episodes of reward 0 (the adapter's rule)
    dones[3, 5:] = 1
    policies = torch.zeros(b, t + 1, dtype=torch.int64)
    # only its step selection is used: no training state, run directory or log needed
    member = PopulationMember(0, None, {}, None, logging.getLogger(__name__), "learner")
    valids = member.valid_steps({"policies": policies, "versions": policies,
                                 "inactive": 1 - active})[:, :t]
    assert valids.sum() == b * t - 4 - 2
    batch = {"obs": {"obs": torch.randn(b, t + 1, 3)}, "rnn": model.initial_state(b),
             "actions": torch.randint(0, 3, (b, t, 1)), "log_probs": torch.full((b, t), -1.1),
             "action_params": torch.randn(b, t, 3), "values": torch.randn(b, t),
             "rewards": torch.randn(b, t) * (active[:, :t] > 0), "dones": dones,
             "time_outs": torch.zeros(b, t)}
    reference = _grads(model, batch, valids)
    inactive = ~active[:, :t].bool()
    changed = dict(batch)
    changed["actions"] = torch.where(inactive[..., None], 2 - batch["actions"], batch["actions"])
    changed["log_probs"] = torch.where(inactive, -0.01, batch["log_probs"])
    changed["action_params"] = batch["action_params"] + 5 * inactive[..., None]
    changed["values"] = batch["values"] + 7 * inactive
    obs = batch["obs"]["obs"].clone()
    obs[:, :t][inactive] += 3.0
    changed["obs"] = {"obs": obs}
    for got, want in zip(_grads(model, changed, valids), reference, strict=True):
        assert torch.allclose(got, want, atol=1e-6)
    counted = _grads(model, changed, torch.ones(b, t, dtype=torch.bool))
    assert any(not torch.allclose(g, w) for g, w in zip(counted, reference, strict=True))


@pytest.mark.multiprocess
def test_a_run_where_an_agent_leaves_trains_on_active_steps_only(tmp_path: Path) -> None:
    """Leavers: 8-step episodes, runner_1 leaves after 4, so 12 of 16 rows-steps are active:
    a batch of 512 steps holds ~384 samples; the agents learn their targets (random play
    scores 3 per episode, perfect play 6: the bar is 4.5)."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(ROOT / "topologies" / "cartpole.yaml"),
         "--run-dir", str(run_dir), "--max-frames", "8000",
         "--set", "env=pettingzoo:tests.components.envs.action_envs:Leavers",
         "--set", "num_envs=4", "--set", "appo.lr=0.003"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    trained = [r["policies"]["0"] for r in records if r["policies"]["0"].get("samples")]
    assert trained and all(330 <= p["samples"] <= 440 for p in trained), trained
    rewards = [p["reward"] for p in trained if p["episodes"]]
    assert rewards and rewards[-1] > 4.5, rewards
