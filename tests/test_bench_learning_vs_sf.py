"""The learning comparison's bookkeeping: Sample Factory's flags carry the topology's recipe, its
episode means are read under sfbus's names, and runs are compared at equal frames."""

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import yaml

from bench import learning_vs_sf
from bench.sample_factory import _episode_means
from sfbus_components.commands.plot import Progress

ROOT = Path(__file__).resolve().parents[1]


def _flag(flags: list[str], name: str) -> str:
    return next(f.split("=", 1)[1] for f in flags if f.startswith(f"--{name}="))


def test_sf_flags_carry_the_breakout_topology_recipe() -> None:
    settings = yaml.safe_load((ROOT / "topologies/atari_breakout.yaml").read_text())["settings"]
    flags = learning_vs_sf.sf_flags(learning_vs_sf.FAMILIES["atari_breakout"], "atari_breakout",
                                    300_000, 7, Path("/tmp/x"))
    appo = settings["appo"]
    assert _flag(flags, "num_envs_per_worker") == str(settings["num_envs"])
    assert _flag(flags, "rollout") == str(settings["rollout"])
    # SF's batch_size is one minibatch: the topology's batch cut into num_batches_per_epoch.
    assert int(_flag(flags, "batch_size")) * appo["num_batches_per_epoch"] == \
        settings["batch_size"]
    assert _flag(flags, "num_epochs") == str(appo["num_epochs"])
    assert float(_flag(flags, "learning_rate")) == appo["lr"]
    assert float(_flag(flags, "exploration_loss_coeff")) == appo["entropy_coeff"]
    assert _flag(flags, "with_vtrace") == "False"
    assert _flag(flags, "encoder_conv_architecture") == "convnet_atari"
    assert _flag(flags, "use_rnn") == "False"
    assert _flag(flags, "seed") == "7"
    assert _flag(flags, "train_for_env_steps") == "300000"
    assert _flag(flags, "policy_initialization") == "orthogonal"
    assert float(_flag(flags, "policy_init_gain")) == settings["model"]["policy_init_gain"]


def test_sf_flags_carry_the_halfcheetah_kl_penalty_and_initialization() -> None:
    settings = yaml.safe_load((ROOT / "topologies/mujoco_halfcheetah.yaml").read_text())
    flags = learning_vs_sf.sf_flags(learning_vs_sf.FAMILIES["mujoco_halfcheetah"],
                                    "mujoco_halfcheetah", 100_000, 0, Path("/tmp/x"))
    assert float(_flag(flags, "kl_loss_coeff")) == settings["settings"]["appo"]["kl_loss_coeff"]
    assert _flag(flags, "policy_initialization") == "torch_default"
    assert not any(f.startswith("--policy_init_gain=") for f in flags)


def test_episode_means_prefer_the_whole_game_score() -> None:
    runner = SimpleNamespace(policy_avg_stats={
        "reward": [deque([1.0, 0.0, 2.0])],
        "true_objective": [deque([1.0, 0.0, 2.0])],
        "RecordEpisodeStatistics_reward": [deque([4.0, 6.0])]})
    assert _episode_means(runner) == {"0": {"reward": 1.0, "true_reward": 5.0}}
    runner.policy_avg_stats.pop("RecordEpisodeStatistics_reward")
    assert _episode_means(runner)["0"]["true_reward"] == 1.0
    assert _episode_means(SimpleNamespace(policy_avg_stats={})) == {}


def test_at_frames_takes_the_last_report_not_past_the_frames() -> None:
    run = Progress("r", time=[1.0, 2.0, 3.0, 4.0], frames=[100, 200, 300, 400],
                   policies=[{"0": {"reward": 1.0}}, {}, {"0": {"reward": 3.0}},
                             {"0": {"reward": 4.0}}])
    assert learning_vs_sf.at_frames(run, 350) == 3.0
    assert learning_vs_sf.at_frames(run, 299) == 1.0
    assert str(learning_vs_sf.at_frames(run, 50)) == "nan"


def test_sf_flags_carry_the_doom_recipe_and_recurrent_model() -> None:
    flags = learning_vs_sf.sf_flags(learning_vs_sf.FAMILIES["doom_basic"], "doom_basic",
                                    1_000_000, 0, Path("/tmp/x"))
    assert _flag(flags, "env") == "doom_basic"
    # Sample Factory learns with its own VizDoom defaults, each flag given once
    assert _flag(flags, "exploration_loss") == "symmetric_kl"
    assert float(_flag(flags, "exploration_loss_coeff")) == 0.001
    assert float(_flag(flags, "ppo_clip_value")) == 0.2
    assert (_flag(flags, "use_rnn"), _flag(flags, "rnn_type"), _flag(flags, "rnn_size")) == \
        ("True", "gru", "512")
    assert _flag(flags, "recurrence") == "32"  # the whole rollout, as sfbus's recurrence 0
    assert _flag(flags, "encoder_conv_architecture") == "convnet_simple"
    assert [f for f in flags if f.startswith("--with_vtrace=")] == ["--with_vtrace=False"]
    assert len([f for f in flags if f.startswith("--exploration_loss=")]) == 1


def test_table_shows_the_frames_trained_on_at_the_last_bar() -> None:
    def run(trained: list[int | None]) -> Progress:
        return Progress("r", time=[1.0, 2.0, 3.0], frames=[100_000, 200_000, 300_000],
                        policies=[{"0": {"reward": reward, "trained": t}}
                                  for reward, t in zip([10.0, 75.0, 80.0], trained, strict=True)])

    text = learning_vs_sf.table("doom_basic", [(run([90_000, 196_608, 290_000]), 10.0),
                                               (run([None, None, None]), 10.0)])
    first, second = text.splitlines()[2:]
    assert first.split(" | ")[4] == "196.6k"  # the first report at or above 70
    assert second.split(" | ")[4] == "not recorded"


def test_sf_flags_carry_sample_factorys_own_battle_settings() -> None:
    flags = learning_vs_sf.sf_flags(learning_vs_sf.FAMILIES["doom_battle"], "doom_battle",
                                    5_000_000, 0, Path("/tmp/x"))
    assert _flag(flags, "env") == "doom_battle"
    assert (_flag(flags, "with_vtrace"), _flag(flags, "normalize_returns")) == ("True", "False")
    assert (_flag(flags, "batch_size"), float(_flag(flags, "max_grad_norm"))) == ("2048", 0.0)
    assert _flag(flags, "policy_init_gain") == "1.0"
