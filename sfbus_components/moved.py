"""Where the components' import paths moved: old name -> new, read by the kernel's imports.

Registered under the ``sfbus.moved`` entry-point group (pyproject.toml), so a run directory's
topology snapshot or a topology written before a move still names classes, env factories and
policy mappings that load (:func:`sfbus.import_object` follows a path that no longer imports).
A key is one ``module:Name`` that moved on its own, one module, or a package ending with a dot
(everything under it moved); a move is added here when it is made, and never removed.
"""

from __future__ import annotations

MOVED: dict[str, str] = {
    # #39 item 6: the package installs as sfbus_components, not a top-level 'components'
    "components.": "sfbus_components.",
    # #16: the flat package grouped by role (datapath, sampling, learning, ...)
    "components.config": "sfbus_components.datapath.settings",
    "components.buffers": "sfbus_components.datapath.buffers",
    "components.messages": "sfbus_components.datapath.messages",
    "components.recovery": "sfbus_components.datapath.slot_stages",
    "components.envs.doom_duel": "sfbus_components.envs.doom.duel",
    "components.envs.doom": "sfbus_components.envs.doom.game",
    "components.envs.doom_match": "sfbus_components.envs.doom.match",
    "components.envs.doom_shm": "sfbus_components.envs.doom.shm",
    "components.envs.doom_spaces": "sfbus_components.envs.doom.spaces",
    "components.env_guard": "sfbus_components.envs.guard",
    "components.episode_player": "sfbus_components.evaluation.episode_player",
    "components.evaluator": "sfbus_components.evaluation.evaluator",
    "components.seeded_episodes": "sfbus_components.evaluation.seeded_episodes",
    "components.batcher": "sfbus_components.learning.batcher",
    "components.checkpoint": "sfbus_components.learning.checkpoint",
    "components.learner_checkpoints": "sfbus_components.learning.checkpoint_schedule",
    "components.distributed": "sfbus_components.learning.distributed",
    "components.learner_faults": "sfbus_components.learning.faults",
    "components.heap": "sfbus.heap",
    "components.learner": "sfbus_components.learning.learner",
    "components.policy": "sfbus_components.models.policy",
    "components.stats": "sfbus_components.monitoring.stats",
    "components.status": "sfbus_components.monitoring.status",
    "components.tensorboard": "sfbus_components.monitoring.tensorboard",
    "components.wandb_sink": "sfbus_components.monitoring.wandb_sink",
    "components.pbt_learner": "sfbus_components.learning.population_member",
    "components.pbt_messages": "sfbus_components.datapath.messages",
    "components.pbt_rules": "sfbus_components.pbt.rules",
    "components.pbt": "sfbus_components.pbt.trainer",
    "components.batched": "sfbus_components.sampling.batched_layout",
    "components.inference": "sfbus_components.sampling.inference_worker",
    "components.policy_mapping": "sfbus_components.sampling.policy_mapping",
    "components.rollout_faults": "sfbus_components.sampling.rollout_faults",
    "components.rollout": "sfbus_components.sampling.rollout_worker",
    # #40 item 1: the learner's population role in learning/, the payloads in the data path
    "sfbus_components.pbt.member": "sfbus_components.learning.population_member",
    "sfbus_components.pbt.messages": "sfbus_components.datapath.messages",
    "sfbus_components.datapath.slot_stages:BatcherStarted":
        "sfbus_components.datapath.messages:BatcherStarted",
    "sfbus_components.algo.normalizers": "sfbus_components.models.normalizers",
    # #40 item 5: each env family in a folder of its own
    "sfbus_components.envs.atari": "sfbus_components.envs.atari.game",
    "sfbus_components.envs.mujoco": "sfbus_components.envs.mujoco.tasks",
    "sfbus_components.envs.envpool_env": "sfbus_components.envs.envpool.pool",
    "sfbus_components.envs.gym_adapter": "sfbus_components.envs.gym.adapter",
    "sfbus_components.envs.pettingzoo_adapter": "sfbus_components.envs.pettingzoo.adapter",
    # #36: malloc's settings are every run process's, set as it starts
    "sfbus_components.learning.heap": "sfbus.heap",
}
