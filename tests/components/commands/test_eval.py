"""``sfbus eval``: one CSV row per seeded episode, reproducible alone, and clear errors."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sfbus.cli import main
from sfbus_components.commands.enjoy import play
from sfbus_components.envs import make_env
from sfbus_components.evaluation.seeded_episodes import SeededEpisodes
from tests.components.commands.test_enjoy import CountingEnv, make_run


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CartPole run directory with an (untrained) checkpoint of policy 0."""
    return make_run(tmp_path_factory.mktemp("eval") / "cartpole", "cartpole.yaml")


def evaluate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run `sfbus eval ARGS` in this process: (exit code, stdout, stderr)."""
    code = main(["eval", *args])
    out, err = capsys.readouterr()
    return code, out, err


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def test_rows_are_the_episodes_of_their_seeds(cartpole_run, tmp_path, capsys):
    code, out, err = evaluate(capsys, str(cartpole_run), "--episodes", "5", "--envs", "3",
                              "--deterministic", "--seed", "100", "--out", str(tmp_path))
    assert code == 0, err
    rows = read_rows(tmp_path / "eval_policy_0.csv")
    episodes, mean = rows[:-1], rows[-1]
    assert [int(r["seed"]) for r in episodes] == [100, 101, 102, 103, 104]
    assert {r["agent"] for r in episodes} == {"0"} and {r["true_return"] for r in rows} == {""}
    # each row is what its seed gives when played alone, through enjoy's loop
    policy = build_policy_from(cartpole_run)
    for row in episodes:
        env = make_env("gym:CartPole-v1")
        try:
            (alone,) = play([policy], [0], 0, env, 1, deterministic=True,
                            seed=int(row["seed"]))
        finally:
            env.close()
        assert (float(row["return"]), int(row["length"])) == (alone[0], alone[1])
    assert len({r["length"] for r in episodes}) > 1  # different seeds, different episodes
    assert mean["seed"] == "mean"
    assert float(mean["return"]) == pytest.approx(
        sum(float(r["return"]) for r in episodes) / 5)
    assert float(mean["length"]) == pytest.approx(sum(int(r["length"]) for r in episodes) / 5)
    assert f"mean return {float(mean['return']):.3f}" in out and "over 5 episodes" in out


def test_envs_side_by_side_change_nothing_and_sampling_replays(cartpole_run, tmp_path, capsys):
    csvs = []
    for envs, mode in (("1", "--deterministic"), ("4", "--deterministic"), ("2", None),
                       ("2", None)):
        out = tmp_path / f"{envs}-{len(csvs)}"
        args = [str(cartpole_run), "--episodes", "6", "--envs", envs, "--seed", "7",
                "--out", str(out), *([mode] if mode else [])]
        assert evaluate(capsys, *args)[0] == 0
        csvs.append(read_rows(out / "eval_policy_0.csv"))
    assert csvs[0] == csvs[1]
    assert csvs[2] == csvs[3]  # sampled actions come from a generator seeded with --seed


def test_every_agent_of_a_multi_agent_env_is_a_row():
    policy = SimpleNamespace(step=lambda obs, rnn, deterministic, generator: SimpleNamespace(
        actions=torch.zeros(rnn.shape[0], 1, dtype=torch.int64), rnn_state=rnn + 1))
    runner = SeededEpisodes([CountingEnv((2, 3)), CountingEnv((2, 3))], [policy, policy], 1,
                            deterministic=True, first_seed=5)
    rows = runner.play(3)
    # an env episode ends once both agents' have: agent 0 plays on unrecorded after step 2
    assert [(r.seed, r.agent, r.episode_return, r.length) for r in rows] == [
        (5, 0, 2.0, 2), (5, 1, 3.0, 3), (6, 0, 2.0, 2), (6, 1, 3.0, 3),
        (7, 0, 2.0, 2), (7, 1, 3.0, 3)]
    assert all(math.isnan(r.true_return) for r in rows)


class FixedPlayer:
    """A player that takes action ``action`` on every row and keeps the widths it was shown."""

    def __init__(self, action: int) -> None:
        self.action, self.widths = action, []

    def step(self, obs, rnn, deterministic, generator):
        self.widths.append(tuple(obs["obs"].shape))
        return SimpleNamespace(actions=torch.full((rnn.shape[0], 1), self.action),
                               rnn_state=rnn)


def test_agents_of_different_spaces_each_act_with_their_own_player():
    tag, kwargs = "pettingzoo:mpe2.simple_tag_v3", {"num_good": 1, "num_adversaries": 3,
                                                     "num_obstacles": 2, "max_cycles": 3}
    predators, prey = FixedPlayer(1), FixedPlayer(4)
    envs = [RecordingEnv(make_env(tag, **kwargs)) for _ in range(2)]
    try:
        runner = SeededEpisodes(envs, [predators, predators, predators, prey], 1,
                                deterministic=True, first_seed=5)
        rows = runner.play(3)
    finally:
        for env in envs:
            env.close()
    # a batched call per player: the 3 predators' 16 numbers, the prey's 14, of both envs
    assert predators.widths[0] == (6, 16) and prey.widths[0] == (2, 14)
    assert [(r.seed, r.agent, r.length) for r in rows] == [
        (seed, agent, 3) for seed in (5, 6, 7) for agent in range(4)]
    # each agent's own action reached the env, every step
    assert envs[1].actions == [[1, 1, 1, 4]] * 3 and len(envs[0].actions) == 6


class RecordingEnv:
    """An env that keeps the actions each step gave its agents."""

    def __init__(self, env) -> None:
        self.env, self.spec, self.actions = env, env.spec, []

    def reset_into(self, obs, seed=None):
        self.env.reset_into(obs, seed=seed)

    def step_into(self, actions, obs):
        self.actions.append([int(a.item()) for a in actions])
        return self.env.step_into(actions, obs)

    def close(self):
        self.env.close()


def test_bad_input_is_one_error_line_and_exit_2(cartpole_run, tmp_path, capsys):
    cases = {
        (str(tmp_path),): "not a run directory",
        (str(cartpole_run), "--policy", "3"): "has no such policy (it trains 0)",
        (str(cartpole_run), "--episodes", "0"): "--episodes must be >= 1",
        (str(cartpole_run), "--envs", "0"): "--envs must be >= 1",
        (str(cartpole_run), "--checkpoint", "best"): "no best checkpoint of policy 0",
    }
    for args, message in cases.items():
        code, out, err = evaluate(capsys, *args, "--out", str(tmp_path / "out"))
        assert code == 2, args
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
        assert out == ""
    assert not (tmp_path / "out").exists()


def build_policy_from(run_dir: Path):
    """The run's policy with its checkpoint's weights, as `sfbus eval` builds it."""
    from sfbus_components.commands.enjoy import build_from_checkpoint, learners, read_checkpoint

    params = learners(run_dir)[0]
    _, state = read_checkpoint(run_dir, params, None)
    env = make_env(params.data.env)
    try:
        return build_from_checkpoint(env.spec, params, state)
    finally:
        env.close()


def test_unusable_out_bad_seeds_and_a_foreign_file_are_one_error_line(cartpole_run, tmp_path,
                                                                      capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a checkpoint")
    out = tmp_path / "out"
    cases = {  # each was a traceback with exit 1, --out made before it
        ("--out", str(a_file / "x")): f"--out {a_file / 'x'}: cannot write files there: Not a "
                                      "directory",
        ("--out", str(a_file)): f"--out {a_file}: cannot write files there",
        ("--out", str(out), "--seed", "-1", "--episodes", "1"):
            "--seed -1: seeds must lie in 0..4294967295",
        ("--out", str(out), "--seed", "4294967295", "--episodes", "2"):
            "--seed 4294967295 with 2 episodes: seeds must lie in 0..4294967295",
        ("--out", str(out), "--checkpoint", str(a_file)):
            f"--checkpoint {a_file}: not a readable checkpoint",
    }
    for args, message in cases.items():
        code, stdout, err = evaluate(capsys, str(cartpole_run), *args)
        assert code == 2, args
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
        assert "delete it" not in err  # the user's own file is not ours to advise deleting
        assert stdout == ""
    assert not out.exists()
    assert a_file.read_text() == "not a checkpoint"


def test_the_csv_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    from sfbus_components.commands import evaluate as evaluate_module
    from sfbus_components.evaluation.seeded_episodes import SeededEpisode

    rows = [SeededEpisode(s, 0, 1.0, math.nan, 3) for s in range(3)]
    out = tmp_path / "eval_policy_0.csv"
    out.write_text("an earlier evaluation\n")

    class Broken:
        def __init__(self, *args):
            self.calls = 0

        def writerow(self, row):
            self.calls += 1
            if self.calls == 3:
                raise OSError(28, "No space left on device")

    monkeypatch.setattr(evaluate_module.csv, "writer", Broken)
    with pytest.raises(OSError, match="No space left"):
        evaluate_module.write_csv(out, rows)
    # was: the earlier file truncated to half a new one
    assert out.read_text() == "an earlier evaluation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_policy_0.csv"]
