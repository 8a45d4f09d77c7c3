"""docs/FROM_SAMPLE_FACTORY.md stays true to the code: every Sample Factory flag has a row, every
sfbus name in the table exists (a renamed setting, option or key fails here), and the worked
example is a valid topology that runs."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sfbus import BadInput
from sfbus.cli import build_parser
from sfbus.topology import RunSettings, Topology, load_topology
from sfbus.topology.loader import PROCESS_KEYS
from sfbus.validation import validate_topology
from sfbus_components.envs.atari.game import AtariEnv
from sfbus_components.envs.doom.game import DoomEnv

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "FROM_SAMPLE_FACTORY.md"
EXAMPLE = ROOT / "examples" / "from_sample_factory_doom_basic.yaml"
# Its actors include every kind a settings path of the table can reach (PBT, stats, TensorBoard).
SETTINGS_TOPOLOGY = ROOT / "topologies" / "cartpole_pbt4.yaml"

# Sample Factory 2.x's flags, read from sample_factory/cfg/cfg.py (commit 1894bd1, November 2025)
# and sf_examples/vizdoom/doom/doom_params.py (add_doom_env_args, add_doom_env_eval_args).
_SF_FLAG_NAMES = """
help algo env experiment train_dir restart_behavior device seed num_policies async_rl
serial_mode batched_sampling num_batches_to_accumulate worker_num_splits
policy_workers_per_policy max_policy_lag num_workers num_envs_per_worker batch_size
num_batches_per_epoch num_epochs rollout recurrence shuffle_minibatches gamma reward_scale
reward_clip value_bootstrap normalize_returns exploration_loss_coeff value_loss_coeff
kl_loss_coeff exploration_loss gae_lambda ppo_clip_ratio ppo_clip_value with_vtrace vtrace_rho
vtrace_c optimizer adam_eps adam_beta1 adam_beta2 max_grad_norm learning_rate lr_schedule
lr_schedule_kl_threshold lr_adaptive_min lr_adaptive_max obs_subtract_mean obs_scale
normalize_input normalize_input_keys decorrelate_experience_max_seconds
decorrelate_envs_on_one_worker actor_worker_gpus set_workers_cpu_affinity
force_envs_single_thread default_niceness log_to_file experiment_summaries_interval
flush_summaries_interval stats_avg summaries_use_frameskip heartbeat_interval
heartbeat_reporting_interval train_for_env_steps train_for_seconds save_every_sec
keep_checkpoints load_checkpoint_kind save_milestones_sec save_best_every_sec save_best_metric
save_best_after benchmark encoder_mlp_layers encoder_conv_architecture encoder_conv_mlp_layers
use_rnn rnn_size rnn_type rnn_num_layers decoder_mlp_layers nonlinearity policy_initialization
policy_init_gain actor_critic_share_weights adaptive_stddev continuous_tanh_scale initial_stddev
use_env_info_cache env_gpu_actions env_gpu_observations env_frameskip env_framestack
pixel_format use_record_episode_statistics episode_counter fps eval_env_frameskip no_render
save_video video_frames video_name max_num_frames max_num_episodes push_to_hub hf_repository
policy_index eval_deterministic train_script enjoy_script sample_env_episodes csv_folder_name
with_wandb wandb_user wandb_project wandb_group wandb_job_type wandb_tags wandb_dir with_pbt
pbt_mix_policies_in_one_env pbt_period_env_steps pbt_start_mutation pbt_replace_fraction
pbt_mutation_rate pbt_replace_reward_gap pbt_replace_reward_gap_absolute pbt_optimize_gamma
pbt_target_objective pbt_perturb_min pbt_perturb_max num_agents num_humans num_bots
start_bot_difficulty timelimit res_w res_h wide_aspect_ratio record_to
"""
SF_FLAGS = _SF_FLAG_NAMES.split()

_ROW = re.compile(r"^\| `--([a-z_0-9]+)`[^|]*\|([^|]*)\|([^|]*)\|$")
_VERDICTS = ("not applicable", "not yet")


def table_rows(text: str) -> list[tuple[str, str, str]]:
    """(Sample Factory flag, sfbus cell, notes cell) of every row of the doc's table."""
    return [(m[1], m[2].strip(), m[3].strip())
            for m in map(_ROW.match, text.splitlines()) if m]


def _command_options() -> dict[str, set[str]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: set(sub._option_string_actions) for name, sub in commands.choices.items()}


def _process_names() -> set[str]:
    return {name for path in (ROOT / "topologies").glob("*.yaml")
            for name in (yaml.safe_load(path.read_text()).get("processes") or {})}


def _env_keywords() -> set[str]:
    return {name for cls in (DoomEnv, AtariEnv)
            for name in inspect.signature(cls.__init__).parameters} - {"self"}


def setting_value(topology: Topology, path: str) -> Any:
    """The value of settings path ``a.b.c`` in the first actor whose parameters have it."""
    parts = path.split(".")
    for process in topology.processes:
        for actor in process.actors:
            value = actor.params
            for part in parts:
                if not dataclasses.is_dataclass(value) or part not in {
                        f.name for f in dataclasses.fields(value)}:
                    break
                value = getattr(value, part)
            else:
                return value
    raise KeyError(path)


def problems(text: str) -> list[str]:
    """Everything wrong with the table in ``text``: missing or repeated flags, empty cells, and
    sfbus names that do not exist (each checked where it lives, settings also through ``--set``
    on a real topology)."""
    rows = table_rows(text)
    found = [flag for flag, _, _ in rows]
    errors = [f"--{f}: no row" for f in SF_FLAGS if f not in found]
    errors += [f"--{f}: not a Sample Factory flag" for f in found if f not in SF_FLAGS]
    errors += [f"--{f}: {found.count(f)} rows" for f in set(found) if found.count(f) > 1]
    options, processes, env_keys = _command_options(), _process_names(), _env_keywords()
    run_fields = {f.name for f in dataclasses.fields(RunSettings)}
    topology = load_topology(SETTINGS_TOPOLOGY)
    overrides = []
    for flag, cell, notes in rows:
        names = re.findall(r"`([^`]+)`", cell)
        if not names and not cell.startswith(_VERDICTS):
            errors.append(f"--{flag}: neither an sfbus name nor {' / '.join(_VERDICTS)}")
        if cell.startswith("not applicable") and not notes:
            errors.append(f"--{flag}: not applicable, but no reason given")
        for name in names:
            words = name.split()
            if words[0] == "sfbus":
                ok = len(words) == 3 and words[2] in options.get(words[1], ())
            elif name.endswith(".yaml"):
                ok = (ROOT / name).is_file()
            elif name.startswith("processes."):
                parts = name.split(".")
                ok = (len(parts) == 3 and parts[1] in processes and parts[2] in PROCESS_KEYS
                      and parts[2] != "actors")
            elif name.startswith("run."):
                ok = name.removeprefix("run.") in run_fields
            elif name.startswith("env_kwargs."):
                ok = name.removeprefix("env_kwargs.") in env_keys
            else:
                try:
                    overrides.append(f"{name}={json.dumps(setting_value(topology, name))}")
                    ok = True
                except KeyError:
                    ok = False
            if not ok:
                errors.append(f"--{flag}: `{name}` does not exist in sfbus")
    if not errors:  # each setting, set to its own value, must pass as `sfbus run --set` does
        try:
            validate_topology(str(SETTINGS_TOPOLOGY), overrides)
        except BadInput as error:  # its message names the setting
            errors.append(f"--set of the table's settings: {error}")
    return errors


def test_every_flag_maps_to_a_name_that_exists() -> None:
    assert problems(DOC.read_text()) == []


@pytest.mark.parametrize(("right", "wrong"), [
    ("`appo.lr`", "`appo.lrr`"),
    ("`appo.num_batches_per_epoch`", "`num_batches_per_epoch`"),
    ("`sfbus run --max-frames`", "`sfbus run --max-frame`"),
    ("`processes.rollout.replicas`", "`processes.rollout.replica`"),
    ("`run.heartbeat_timeout_s`", "`run.heartbeat_timeout`"),
    ("`env_kwargs.frameskip`", "`env_kwargs.frame_skip`"),
    ("`topologies/pbt8.yaml`", "`topologies/pbt9.yaml`"),
])
def test_a_misspelt_name_is_caught(right: str, wrong: str) -> None:
    lines = DOC.read_text().splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines)
               if (m := _ROW.match(line.rstrip())) and right in m[2])  # its sfbus cell
    lines[row] = lines[row].replace(right, wrong, 1)
    found = problems("".join(lines))
    assert any(wrong in error for error in found), found


def test_a_missing_or_unexplained_row_is_caught() -> None:
    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `--benchmark`"))
    assert "--benchmark: no row" in problems(text.replace(row + "\n", ""))
    bare = re.sub(r"\|[^|]*\|$", "| |", row)
    assert "--benchmark: not applicable, but no reason given" in problems(text.replace(row, bare))


def test_worked_example_validates_with_the_translated_values() -> None:
    topology = validate_topology(str(EXAMPLE))
    assert {p.name: p.replicas for p in topology.processes}["rollout"] == 8
    assert setting_value(topology, "num_envs") == 4
    assert setting_value(topology, "batch_size") == 1024
    assert setting_value(topology, "env_kwargs") == {"frameskip": 4, "resolution": [128, 72]}
    appo = setting_value(topology, "appo")
    assert (appo.with_vtrace, appo.max_policy_lag, appo.exploration_loss, appo.entropy_coeff,
            appo.ppo_clip_value) == (False, 1000, "symmetric_kl", 0.001, 0.2)


def test_the_docs_yaml_is_the_example() -> None:
    block = re.search(r"```yaml\n(name: from_sample_factory.*?)```", DOC.read_text(), re.S)
    assert block is not None
    assert yaml.safe_load(block[1]) == yaml.safe_load(EXAMPLE.read_text())


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_worked_example_runs_briefly(tmp_path: Path) -> None:
    # Two rollout processes instead of the example's 8: a 2-core test machine.
    done = subprocess.run(
        [sys.executable, "-m", "sfbus", "run", str(EXAMPLE), "--run-dir", str(tmp_path / "run"),
         "--max-frames", "20000", "--set", "processes.rollout.replicas=2"],
        capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reached --max-frames 20000" in done.stderr, done.stderr[-3000:]
