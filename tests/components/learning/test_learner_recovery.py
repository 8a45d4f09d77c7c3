"""The learner through faults: repeated non-finite updates, and a restart mid-run."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from sfbus_components.learning.faults import MAX_RESTORES_IN_A_ROW, restore_published
from tests.components.datapath.test_recovery import restart
from tests.components.learning.test_learner import (
    BATCH,
    bandit_batch,
    bandit_learner,
    learner_topology,
    published,
    until,
)
from tests.kernel.conftest import hosted


def weights(learner) -> list[torch.Tensor]:
    """A copy of the learner's parameters."""
    return [p.detach().clone() for p in learner.training.policy.parameters()]


def test_bad_updates_in_a_row_restore_the_last_good_state(caplog) -> None:
    learner = bandit_learner()
    learner._numerics.every = 1  # a copy before every healthy batch
    gen = torch.Generator().manual_seed(0)
    learner.train(bandit_batch(learner, gen))
    good = weights(learner)
    learner.train(bandit_batch(learner, gen))  # the copy of `good` is taken before this one
    assert not all(torch.equal(a, b) for a, b in zip(good, weights(learner), strict=True))

    # A poisoned weight makes every loss NaN: each update is skipped, and the 5th puts back the
    # last good state (the weights before the second batch).
    batches = [bandit_batch(learner, gen) for _ in range(5)]  # acted by a healthy policy
    with torch.no_grad():
        next(learner.training.policy.parameters()).view(-1)[0] = math.nan
    with caplog.at_level(logging.WARNING):
        for i, batch in enumerate(batches):
            result = learner.train(batch)
            assert result["skipped"] == 1
            assert learner._numerics.restores == (1 if i == 4 else 0)
    assert all(torch.equal(a, b) for a, b in zip(good, weights(learner), strict=True))
    assert "5 non-finite updates in a row; restored the last good state" in caplog.text
    result = learner.train(bandit_batch(learner, gen))
    assert result["skipped"] == 0 and math.isfinite(result["policy_loss"])


def test_each_restore_counts_against_the_actors_failure_budget() -> None:
    """A restore between finite updates is a contained failure: reported once per restore (the
    kernel's budget then ends the process, tests/kernel/test_watchdog.py), never per batch."""
    learner = bandit_learner()
    failures: list[str] = []
    learner._failure_listeners.append(lambda actor, where, error: failures.append(where))
    gen = torch.Generator().manual_seed(0)
    for round_ in (1, 2):
        for _ in range(learner.params.max_bad_updates):
            batch = bandit_batch(learner, gen)
            batch["rewards"][0, 0] = math.nan
            learner._report(learner.train(batch))
        assert failures == ["numerics"] * round_
        learner._report(learner.train(bandit_batch(learner, gen)))  # finite: no restore
        assert failures == ["numerics"] * round_
    assert learner._numerics.restores == 2


def test_a_good_update_resets_the_count() -> None:
    learner = bandit_learner()
    gen = torch.Generator().manual_seed(0)
    for bad in (4, 4):
        for _ in range(bad):
            batch = bandit_batch(learner, gen)
            batch["rewards"][0, 0] = math.nan
            assert learner.train(batch)["skipped"] == 1
        assert learner.train(bandit_batch(learner, gen))["skipped"] == 0
    assert learner._numerics.restores == 0


def test_a_learner_whose_every_update_is_non_finite_fails_within_bounded_batches() -> None:
    """NaN rewards in every batch: restores follow each other with nothing finite between;
    after MAX_RESTORES_IN_A_ROW of them training raises (the learner's process then gives up
    after max_failed_batches), where it used to restore and publish new versions for ever."""
    learner = bandit_learner()
    gen = torch.Generator().manual_seed(0)
    bounded = learner.params.max_bad_updates * (MAX_RESTORES_IN_A_ROW + 1)
    with pytest.raises(RuntimeError, match=r"3 restores of the last good state with no finite "
                                           r"update between: training cannot go on"):
        for _ in range(bounded):
            batch = bandit_batch(learner, gen)
            batch["rewards"][0, 0] = math.nan
            learner.train(batch)
    assert learner._numerics.restores == MAX_RESTORES_IN_A_ROW


@pytest.mark.parametrize("torn", [False, True])
async def test_restarted_learner_continues_from_its_published_weights(torn: bool) -> None:
    # No run directory, so no checkpoint: only shared memory survives the "crash".
    async with hosted(learner_topology("async"), "ipc") as actors:
        learner, driver = actors["learner"], actors["driver"]
        await until(lambda: driver.idle == 1)
        for n in (2, 3):
            driver.batch_ready.emit(BATCH)
            await until(lambda n=n: driver.idle == n and learner.weights.version == n)
        final = published(learner)
        if torn:  # killed in the middle of publishing version 4
            learner.weights.counter[0] = 2 * 4 - 1

        learner = (await restart(actors, "learn"))["learner"]
        await until(lambda: driver.idle == 4)
        if torn:
            assert learner.training.version == 4 and learner.weights.version == 4
        else:
            assert learner.training.version == 3 and torch.equal(published(learner), final)
            assert all(torch.equal(a, b) for a, b in zip(
                learner.training.policy.published_tensors(), _split(final, learner),
                strict=True))
        driver.batch_ready.emit(BATCH)
        await until(lambda: driver.idle == 5 and learner.weights.version == (5 if torn else 4))


def _split(flat: torch.Tensor, learner) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in learner.training.policy.published_tensors():
        out.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


def test_a_fresh_run_does_not_take_unpublished_weights() -> None:
    learner = bandit_learner()

    class _Weights:
        counter = torch.zeros(1, dtype=torch.int64).numpy()

    assert not restore_published(_Weights(), learner.training)
    assert learner.training.version == 1
