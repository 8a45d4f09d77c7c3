"""The training figures: declared once on TrainingStats, and every one measured by a real step."""

from __future__ import annotations

import math

import msgspec

from sfbus_components.datapath.messages import TRAINING_FIGURES, TrainingStats
from tests.components.learning.test_learner import BATCH, learner_topology, until
from tests.kernel.conftest import hosted


def test_every_float_field_is_a_figure_with_its_own_tag_and_doc() -> None:
    fields = msgspec.structs.fields(TrainingStats)
    floats = [f.name for f in fields if f.type is float or "float" in str(f.type)]
    assert list(TRAINING_FIGURES) == floats  # declaration order, nothing spelled twice
    assert [f.name for f in fields if f.name not in TRAINING_FIGURES] == [
        "policy", "version", "samples", "env_frames"]
    tags = [figure.tag for figure in TRAINING_FIGURES.values()]
    assert len(set(tags)) == len(tags)
    assert all(tag.split("/")[0] in ("train", "perf", "stats") for tag in tags)
    assert all(figure.doc for figure in TRAINING_FIGURES.values())


async def test_a_real_training_step_measures_every_figure() -> None:
    async with hosted(learner_topology("async"), "inproc") as actors:
        driver = actors["driver"]
        await until(lambda: driver.idle == 1)
        driver.batch_ready.emit(BATCH)
        await until(lambda: bool(driver.stats))
    stats: TrainingStats = driver.stats[0]
    # the learner trains on the CPU here: no GPU memory to report
    missing = [name for name in TRAINING_FIGURES
               if not math.isfinite(getattr(stats, name)) and name != "gpu_memory"]
    assert missing == []
    assert math.isnan(stats.gpu_memory)
    assert stats.kl_max >= stats.kl >= -1e-6 and stats.value_delta_max >= stats.value_delta >= 0
    assert stats.ratio_min <= stats.ratio_mean <= stats.ratio_max
    assert stats.ratio_deviation <= max(stats.ratio_max - 1, 1 - stats.ratio_min) + 1e-6
    assert stats.obs_running_std > 0 and stats.returns_running_std > 0
    assert stats.memory > 50  # a process holding torch
