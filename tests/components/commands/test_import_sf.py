"""``sfbus import-sf``: a Sample Factory experiment becomes a run directory whose policy computes
what Sample Factory's did, and that enjoy, eval, export and ``--resume`` take.

The experiments under ``tests/fixtures/sample_factory/`` were trained by Sample Factory 2.1.1
itself (``python -m bench.sf_fixtures``), each with ``reference.pt``: observations of an episode,
the RNN state each step got, and Sample Factory's own model's action logits, values (normalized
and denormalized) and new RNN states for them. Sample Factory is not needed here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from sfbus.cli import main
from sfbus_components.commands.enjoy import learner_params, read_checkpoint
from sfbus_components.envs import env_spec
from sfbus_components.learning.checkpoint import latest_checkpoint
from sfbus_components.models.normalizers import ReturnsNormalizer
from sfbus_components.models.policy import Policy

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "sample_factory"
NAMES = ("doom_basic", "cartpole")
"""A conv + GRU VizDoom model, and an MLP with no RNN."""


def import_sf(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``sfbus import-sf ARGS``: exit code, stdout, stderr."""
    code = main(["import-sf", *args])
    out, err = capsys.readouterr()
    return code, out, err


# sfbus's VizDoom scenarios may find an installed sample-factory's files: the import runs with
# its modules blocked, so that it is known to need none of them.
_WITHOUT_SAMPLE_FACTORY = ("import sys; sys.modules['sample_factory'] = None; "
                           "sys.modules['sf_examples'] = None; from sfbus.cli import main; "
                           "sys.exit(main(sys.argv[1:]))")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each fixture imported once into a run directory of its own, Sample Factory blocked."""
    runs = {}
    for name in NAMES:
        runs[name] = tmp_path_factory.mktemp("imported") / name
        done = subprocess.run([sys.executable, "-c", _WITHOUT_SAMPLE_FACTORY, "import-sf",
                               str(FIXTURES / name), "--run-dir", str(runs[name])],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
    return runs


def load_policy(run_dir: Path) -> tuple[Policy, ReturnsNormalizer, dict]:
    """The imported policy as enjoy loads it, its returns normalizer and its checkpoint."""
    params = learner_params(run_dir, None)
    _, state = read_checkpoint(run_dir, params, None)
    policy = Policy(env_spec(params.data.env, **params.data.env_kwargs), params.data.model)
    policy.load_state_dict(state["policy"])
    returns = ReturnsNormalizer()
    returns.load_state_dict(state["returns_normalizer"])
    return policy.eval(), returns, state


@pytest.mark.parametrize("name", NAMES)
def test_imported_policy_gives_sample_factorys_distribution_and_value(name, imported):
    policy, returns, _ = load_policy(imported[name])
    ref = torch.load(FIXTURES / name / "reference.pt", weights_only=True)
    rows = len(ref["values"])
    # the reference is a trained model's, on an episode: not initial weights or statistics
    assert ref["action_logits"].std(dim=0).max() > 1e-3
    assert all(float(s.count) > 1000 for s in policy.obs_normalizer.stats.values())
    state = ref["rnn_states"] if policy.model.state_size else torch.zeros(rows, 0)
    with torch.no_grad():
        out = policy.model.forward_step(policy.obs_normalizer(ref["obs"]), state)
        probs = torch.softmax(out.action_logits, dim=1)
    close = {"atol": 1e-5, "rtol": 1e-4}
    torch.testing.assert_close(out.action_logits, ref["action_logits"], **close)
    torch.testing.assert_close(probs, torch.softmax(ref["action_logits"], dim=1), **close)
    torch.testing.assert_close(out.value, ref["values"], **close)
    torch.testing.assert_close(returns.denormalize(out.value), ref["values_denormalized"],
                               **close)
    if policy.model.state_size:
        assert ref["rnn_states"][1:].abs().max() > 0  # the state carried along the episode
        torch.testing.assert_close(out.rnn_state, ref["new_rnn_states"], **close)


def test_settings_and_counters_follow_config_json(imported):
    config = json.loads((FIXTURES / "doom_basic" / "config.json").read_text())
    settings = yaml.safe_load((imported["doom_basic"] / "topology.yaml").read_text())["settings"]
    assert settings["env"] == "doom_basic"
    assert settings["env_kwargs"] == {"frameskip": 4, "resolution": [64, 36]}
    model = settings["model"]
    assert (model["encoder"], model["hidden"], model["core"], model["core_size"]) == \
        ("conv_simple", 64, "gru", 64)
    assert settings["appo"]["lr"] == config["learning_rate"]
    assert settings["appo"]["exploration_loss"] == config["exploration_loss"]
    assert settings["batch_size"] == config["batch_size"] * config["num_batches_per_epoch"]
    assert settings["num_envs"] == config["num_envs_per_worker"]
    assert settings["seed"] == config["seed"]
    checkpoint = next((FIXTURES / "doom_basic" / "checkpoint_p0").glob("*.pth"))
    _, train_step, env_steps = checkpoint.stem.split("_")
    _, _, state = load_policy(imported["doom_basic"])
    assert (state["train_steps"], state["env_frames"]) == (int(train_step), int(env_steps))
    assert state["version"] == int(train_step) + 1
    cartpole = yaml.safe_load((imported["cartpole"] / "topology.yaml").read_text())["settings"]
    assert cartpole["env"] == "gym:CartPole-v1"
    assert (cartpole["model"]["core"], cartpole["model"]["mlp_layers"]) == ("none", [32, 32])


def test_topology_names_the_layout_imported_into(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, _, _ = import_sf(capsys, str(FIXTURES / "cartpole"), "--run-dir", str(run_dir),
                           "--topology", str(ROOT / "topologies" / "cartpole.yaml"))
    assert code == 0
    snapshot = yaml.safe_load((run_dir / "topology.yaml").read_text())
    assert snapshot["name"] == "sf_cartpole"
    assert snapshot["settings"]["report_every_s"] == 2  # cartpole.yaml's own
    assert snapshot["settings"]["appo"]["num_epochs"] == 1  # the experiment's, over its 2


def test_enjoy_and_eval_take_the_imported_mlp_run(imported, capsys):
    cartpole = str(imported["cartpole"])
    assert main(["enjoy", cartpole, "--episodes", "1", "--max-steps", "20", "--seed", "1"]) == 0
    assert "episode 1: return" in capsys.readouterr().out
    assert main(["eval", cartpole, "--episodes", "2", "--envs", "2"]) == 0
    assert "return" in capsys.readouterr().out


def test_enjoy_and_export_take_the_imported_conv_gru_run(imported, tmp_path, capsys):
    doom = str(imported["doom_basic"])
    assert main(["enjoy", doom, "--episodes", "1", "--max-steps", "5", "--seed", "1"]) == 0
    assert "episode 1: return" in capsys.readouterr().out
    onnx = tmp_path / "policy.onnx"
    assert main(["export", doom, "--onnx", str(onnx)]) == 0
    assert "rnn_state" in capsys.readouterr().out and onnx.stat().st_size > 0


@pytest.mark.multiprocess
def test_resume_fine_tunes_the_imported_policy(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert import_sf(capsys, str(FIXTURES / "cartpole"), "--run-dir", str(run_dir))[0] == 0
    before = latest_checkpoint(run_dir / "checkpoints" / "policy_0")
    imported_version = int(before.stem.split("_")[1])
    imported_frames = load_policy(run_dir)[2]["env_frames"]
    assert imported_frames == 20480  # the experiment's env_steps
    # --max-frames counts on from the imported env frames, as Sample Factory's
    # train_for_env_steps counts from the checkpoint's env_steps: this run adds about 1000
    done = subprocess.run([sys.executable, "-m", "sfbus", "run", "--resume", str(run_dir),
                           "--serial", "--max-frames", str(imported_frames + 1000)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    after = latest_checkpoint(run_dir / "checkpoints" / "policy_0")
    assert int(after.stem.split("_")[1]) > imported_version
    trained = load_policy(run_dir)[2]["env_frames"]
    assert imported_frames < trained < imported_frames + 3000  # a few batches of 256 past it


def _experiment_with(tmp_path: Path, name: str, **changes: object) -> Path:
    """A copy of fixture ``name`` whose config.json has ``changes``."""
    folder = tmp_path / f"sf_{name}"
    shutil.copytree(FIXTURES / name, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize(("make", "extra", "message"), [
    (lambda tmp: tmp, (), "not a Sample Factory experiment (no config.json)"),
    (lambda tmp: _experiment_with(tmp, "cartpole", env="NoSuchEnv-v9"), (),
     "env 'NoSuchEnv-v9' is not imported"),
    (lambda tmp: _experiment_with(tmp, "cartpole", actor_critic_share_weights=False), (),
     "actor_critic_share_weights false is not imported"),
    (lambda tmp: _experiment_with(tmp, "doom_basic", rnn_size=32), (),
     "the model does not match the sfbus model its config.json describes"),
    (lambda tmp: FIXTURES / "cartpole", ("--topology", "no/such.yaml"),
     "--topology no/such.yaml: no such file"),
], ids=["not_sf", "unknown_env", "separate_weights", "weights_mismatch", "no_topology"])
def test_bad_experiment_is_one_error_line_exit_2_and_nothing_written(make, extra, message,
                                                                      tmp_path, capsys):
    run_dir = tmp_path / "out" / "run"
    code, out, err = import_sf(capsys, str(make(tmp_path)), "--run-dir", str(run_dir), *extra)
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert not run_dir.exists()


def test_an_occupied_run_dir_is_refused_and_kept(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "mine.txt").write_text("keep")
    code, _, err = import_sf(capsys, str(FIXTURES / "cartpole"), "--run-dir", str(run_dir))
    assert code == 2 and "is not an empty directory" in err
    assert [p.name for p in run_dir.iterdir()] == ["mine.txt"]
