"""pettingzoo_simple_tag.yaml through the real CLI: predators and prey of different observation
spaces train side by side, each policy with its own model, and play back, score, export and
push side by side; a mapping that sends an agent to a policy of another space is one located
error before anything starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from sfbus_components.learning.checkpoint import load_checkpoint

SIMPLE_TAG = Path(__file__).parents[2] / "topologies" / "pettingzoo_simple_tag.yaml"


def observation_widths(checkpoint: Path) -> tuple[int, int]:
    """What a checkpoint's policy reads an observation with: its first layer's input width and
    its observation normalizer's width."""
    policy = load_checkpoint(checkpoint)["policy"]
    assert policy["obs_normalizer.stats.obs.count"] > 0  # statistics of its own side's steps
    return (policy["model.encoder.branches.obs.net.0.weight"].shape[1],
            policy["obs_normalizer.stats.obs.mean"].shape[0])


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_predators_and_prey_each_train_their_own_model(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(SIMPLE_TAG), "--run-dir", str(run_dir),
         "--max-frames", "2000", "--max-seconds", "40", "--set", "num_envs=4",
         "--set", "batch_size=200"],
        capture_output=True, text=True, timeout=55)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " raised " not in done.stderr, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    last = records[-1]["policies"]
    for policy in ("0", "1"):  # both learners trained on their own side's steps
        assert last[policy]["version"] >= 1, last
        assert last[policy]["episodes"] > 0 and last[policy]["length"] == 25, last
    # each learner's model reads its own side's observation: 16 numbers a predator, 14 the prey
    newest = [max((run_dir / "checkpoints" / f"policy_{policy}").glob("*.pt"))
              for policy in (0, 1)]
    assert [observation_widths(checkpoint) for checkpoint in newest] == [(16, 16), (14, 14)]
    # played back: the prey (policy 1) beside the predators, each side with its own policy
    played = subprocess.run([sys.executable, "-m", "sfbus", "enjoy", str(run_dir), "--policy",
                             "1", "--episodes", "2"], capture_output=True, text=True, timeout=60)
    assert played.returncode == 0, played.stderr[-3000:]
    assert "agents agent_0 play policy 1; the others their own policies'" in played.stdout
    assert re.search(r"mean length 25\.0 over 2 episodes", played.stdout), played.stdout
    # exported over its own side's spaces: the prey's 14 numbers in, its 5 actions' logits out
    onnx = tmp_path / "prey.onnx"
    exported = subprocess.run([sys.executable, "-m", "sfbus", "export", str(run_dir), "--policy",
                               "1", "--onnx", str(onnx)], capture_output=True, text=True,
                              timeout=60)
    assert exported.returncode == 0, exported.stderr[-3000:]
    session = onnxruntime.InferenceSession(str(onnx))
    shapes = {i.name: i.shape for i in (*session.get_inputs(), *session.get_outputs())}
    assert shapes["obs"][-1] == 14 and shapes["action_logits"][-1] == 5, shapes
    # evaluated: the prey's rows (agent 3) beside the predators' own policy, seeded episodes
    scored = subprocess.run([sys.executable, "-m", "sfbus", "eval", str(run_dir), "--policy", "1",
                             "--episodes", "3", "--envs", "2", "--out", str(tmp_path / "eval")],
                            capture_output=True, text=True, timeout=60)
    assert scored.returncode == 0, scored.stderr[-3000:]
    rows = (tmp_path / "eval" / "eval_policy_1.csv").read_text().splitlines()
    assert [row.split(",")[:2] for row in rows[1:4]] == [["0", "3"], ["1", "3"], ["2", "3"]]
    assert all(row.split(",")[4] == "25" for row in rows[1:4]), rows
    # refused, no traceback: an opponent for agents 1.. (each side plays its own policy)
    refused = subprocess.run([sys.executable, "-m", "sfbus", "eval", str(run_dir), "--policy", "1",
                              "--opponent", str(newest[0])], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1].startswith("error: --opponent: policy 1 "
                                                              "plays beside agents of other")
    # pushed with the predators' newest checkpoint beside it: the folder alone scores the same
    # (the card plays 3 episodes on 3 envs, sampled from seed 0)
    folder = tmp_path / "hub"
    pushed = subprocess.run([sys.executable, "-m", "sfbus", "push", str(run_dir), "--policy", "1",
                             "--repo", "user/prey", "--no-upload", "--local-dir", str(folder),
                             "--episodes", "3"], capture_output=True, text=True, timeout=60)
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    info = json.loads((folder / "sfbus.json").read_text())
    assert info["beside"] == {"0": str(newest[0].relative_to(run_dir))}
    assert (folder / info["beside"]["0"]).read_bytes() == newest[0].read_bytes()
    assert "policy 0 (`checkpoints/policy_0/" in (folder / "README.md").read_text()
    again = subprocess.run([sys.executable, "-m", "sfbus", "eval", str(folder), "--policy", "1",
                            "--episodes", "3", "--envs", "3", "--out", str(tmp_path / "again")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]
    mean = (tmp_path / "again" / "eval_policy_1.csv").read_text().splitlines()[-1].split(",")
    assert float(mean[2]) == pytest.approx(info["mean_reward"])

@pytest.mark.parametrize(("mapping", "message"), [
    ('{"adversary_0": 1, "*": 0}',
     r"agent 'agent_0' \(observation \{obs float32 \[14\]\}.*\) is mapped to policy 0, whose "
     r"agent 'adversary_1' has observation \{obs float32 \[16\]\}"),
    ("{}", r"the env's agents differ in observation or action space"),
])
def test_a_mapping_across_spaces_is_a_located_error_at_validation(mapping: str,
                                                                   message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "validate", str(SIMPLE_TAG),
         "--set", f"agent_policies={mapping}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert re.match(r"error: \S+pettingzoo_simple_tag\.yaml:\d+:\d+: ", line), line
    assert re.search(message, line), line


@pytest.mark.parametrize(("actor", "message"), [
    # its episodes act for every agent of an env with the one policy it scores
    ("processes.evaluator.actors.evaluator.class=sfbus_components.evaluation.evaluator:Evaluator",
     "actor 'evaluator': the evaluator plays one policy for every agent of an env, but "
     "agent_policies"),
    # its exchanges copy one policy's weights into another
    ("processes.learner.actors.pbt.class=sfbus_components.pbt.trainer:PopulationTrainer",
     "actor 'pbt': PBT copies weights between the policies, but agent_policies gives them "
     "agents of different spaces"),
])
def test_an_actor_needing_one_model_for_all_is_refused_at_validation(actor: str,
                                                                      message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "sfbus", "validate", str(SIMPLE_TAG), "--set",
                           actor], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert re.match(r"error: \S+pettingzoo_simple_tag\.yaml: ", line), line
    assert message in line, line
