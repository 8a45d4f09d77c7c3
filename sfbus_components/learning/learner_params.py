"""The learner's parameters: APPO's and the learner's own knobs, each checked where it is parsed.

The data path's settings (env, model, T, batch size, mode, seed) are not among them: the learner
reads them from the run record (``context.records[DataPath].params``), as every actor but the
rollout actor does. What needs both is checked before anything starts: ``check_data_path`` from
the learner's ``shared_arrays`` hook (``sfbus validate`` and ``run``, a located error),
``check_resume`` and ``check_limits`` when ``sfbus run`` asks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sfbus import RunLimits, RunRecords, Seconds
from sfbus_components.algo import AppoConfig
from sfbus_components.datapath.record import DataPath
from sfbus_components.datapath.settings import DataPathParams
from sfbus_components.learning.checkpoint import CheckpointError, config_fingerprint, load_newest
from sfbus_components.models.device import check_device


@dataclass(frozen=True)
class LearnerParams:
    """The learner's parameters (``Learner.Params``): its own knobs; the data path's settings are
    the run record's."""

    policy: int = 0
    """Policy id this learner trains."""
    appo: AppoConfig = field(default_factory=AppoConfig)
    """APPO hyperparameters (``--set appo.lr=...``)."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this, and by the env's own scale (``EnvSpec.reward_scale``:
    0.01 on doom_basic, as Sample Factory), before the loss."""
    checkpoint_every_s: Seconds = 120.0
    """Seconds between checkpoints (one more is written at a graceful stop)."""
    keep_checkpoints: int = 3
    """Newest checkpoints kept; older ones are deleted."""
    save_best_metric: Literal["true_return", "episode_return", ""] = "true_return"
    """Score of the best checkpoint (``checkpoints/policy_<id>/best``): the mean of the
    last 100 episodes' unshaped score (their return where the env reports none), or of their
    return; "" writes none. Needs ``rollout.episode_finished`` wired to this learner."""
    save_best_after: int = 100_000
    """Env frames trained on before a best checkpoint is written (early means are noise)."""
    save_best_every_s: Seconds = 5.0
    """Seconds at least between two best checkpoints (a rising metric beats it often)."""
    save_milestones_s: Seconds = 0.0
    """Seconds between milestone checkpoints (``milestones/``, all kept); 0: none."""
    torch_threads: int = 1
    """Intra-op threads of torch in this process (1: the learner owns a core)."""
    sequence_threads: int = 1
    """Threads the forward and backward pass over a batch split its trajectories over, each
    running its ops on ``torch_threads`` threads (CPU; on a GPU the pass runs whole).
    ``appo_local_inference.yaml`` gives it 2 with one torch thread each, sharing the rollout
    processes' cores: a share whose core is taken stalls only itself, where one op on two
    threads waits for both (:mod:`sfbus_components.models.threaded_sequence`)."""
    max_bad_updates: int = 5
    """Non-finite updates in a row after which the last good state is put back."""
    good_state_every: int = 20
    """Batches between the in-memory copies of the last good state."""
    peer_timeout_s: Seconds = 300.0
    """Distributed runs: seconds to wait for the other nodes' learners (joining, each step)."""
    max_failed_batches: int = 3
    """Batches in a row whose training raised after which the learner's process gives up
    (exit 1: restarted by the supervisor); a failing periodic checkpoint is only reported
    and retried at the next interval."""
    device: str = "auto"
    """``auto`` (a GPU when one is visible), ``cpu``, ``cuda`` or ``cuda:N``; without an
    index, policy ``i`` (plus the rank's local rank under torchrun) trains on GPU
    ``i mod n`` (:mod:`sfbus_components.models.device`)."""

    def __post_init__(self) -> None:
        check_device(self.device)
        for name in ("torch_threads", "sequence_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.reward_scale <= 1e6:
            raise ValueError(f"reward_scale must be > 0 and <= 1e6, got {self.reward_scale}")

    def every_state(self, rollout: int) -> bool:
        """Whether a batch carries the RNN state entering every step (``[n, rollout + 1, S]``),
        which GAE and a recurrence shorter than the rollout start from, or only step 0's."""
        return 0 < self.appo.recurrence < rollout or not self.appo.with_vtrace

    def check_data_path(self, data: DataPathParams) -> None:
        """Refuse APPO settings the run's data path ``data`` cannot feed (a ValueError)."""
        # Minibatches are whole trajectories: with fewer than one each, some would be empty
        # and every training step would fail at run time.
        if self.appo.recurrence and data.rollout % self.appo.recurrence:
            raise ValueError(f"appo.recurrence ({self.appo.recurrence}) must divide the "
                             f"rollout ({data.rollout})")
        if self.appo.num_batches_per_epoch > data.trajectories_per_batch:
            raise ValueError(
                f"appo.num_batches_per_epoch ({self.appo.num_batches_per_epoch}) exceeds the "
                f"trajectories of a batch (batch_size {data.batch_size} / rollout "
                f"{data.rollout} = {data.trajectories_per_batch}); every minibatch needs one")

    def check_resume(self, run_dir: Path, records: RunRecords) -> None:
        """Refuse a ``--resume`` whose newest checkpoint of this policy was saved with
        another env or model than the run's data path (``sfbus run`` asks before anything
        starts)."""
        data = records[DataPath].params
        folder = Path(run_dir, "checkpoints", f"policy_{self.policy}")
        try:
            load_newest(folder, config_fingerprint(data.env, data.model))
        except CheckpointError as error:
            raise ValueError(str(error)) from None

    def check_limits(self, limits: RunLimits) -> None:
        """Refuse run limits a setting cannot work with (``sfbus run`` asks before
        anything starts)."""
        if self.appo.lr_schedule == "linear_decay" and not limits.max_frames:
            raise ValueError("appo.lr_schedule linear_decay decays the rate over the run's "
                             "--max-frames; give --max-frames or another schedule")
