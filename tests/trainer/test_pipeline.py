"""The overlapped whole loop's pipeline: batches made ahead of the trainer, never more than K
changes of the weights behind those they are trained into."""

from __future__ import annotations

import asyncio

import pytest

from art_proxy.records import TrainableGroup
from art_proxy_trainer.pipeline import Pipeline


class Timeline:
    """A producer and a trainer of set speeds, and what each saw: for each batch, the weights the
    alias served when its rollouts began (counted in changes of the weights) and the weights it
    was trained into. Steps listed in `abandoned` change nothing; those in `refused` change the
    weights but their adapter is never served."""

    def __init__(
        self,
        rollout_s: float,
        train_s: float,
        abandoned: frozenset[int] = frozenset(),
        refused: frozenset[int] = frozenset(),
    ) -> None:
        self.rollout_s, self.train_s = rollout_s, train_s
        self.abandoned, self.refused = abandoned, refused
        self.weights = 0  # changes of the weights so far
        self.served = 0  # the weights the alias serves
        self.sampled_by: dict[int, int] = {}
        self.trained_into: dict[int, int] = {}

    async def produce(self, number: int) -> tuple[list[TrainableGroup], dict[str, float]]:
        self.sampled_by[number] = self.served
        await asyncio.sleep(self.rollout_s)
        return [], {}

    def behind(self, number: int) -> int:
        return self.trained_into[number] - self.sampled_by[number]

    async def run(self, ahead: int, batches: int) -> list[dict[str, float]]:
        pipeline = Pipeline(self.produce, 1, ahead, batches)
        pipeline.start()
        metrics = []
        try:
            for _ in range(batches):
                batch = await pipeline.take()
                self.trained_into[batch.number] = self.weights
                await asyncio.sleep(self.train_s)
                moved = batch.number not in self.abandoned
                self.weights += moved
                served = moved and batch.number not in self.refused
                if served:
                    self.served = self.weights
                pipeline.stepped(moved_weights=moved, served=served)
                metrics.append(batch.metrics)
        finally:
            await pipeline.aclose()
        return metrics


@pytest.mark.parametrize("ahead", [1, 2, 4])
@pytest.mark.parametrize(("rollout_s", "train_s"), [(0.001, 0.02), (0.02, 0.001), (0.01, 0.01)])
async def test_no_batch_is_trained_more_than_k_changes_of_the_weights_behind(
    ahead: int, rollout_s: float, train_s: float
) -> None:
    timeline = Timeline(rollout_s, train_s)
    metrics = await timeline.run(ahead, batches=8)
    lags = [timeline.behind(n) for n in range(1, 9)]
    assert max(lags) <= ahead
    if rollout_s < train_s:  # the rollouts run ahead as far as the bound lets them
        assert max(lags) == ahead
        # K = 1: the next batch samples while a step trains; from K = 2, batches wait ready.
        assert max(m["pipeline_queue_depth"] for m in metrics) == ahead


@pytest.mark.parametrize("ahead", [1, 2])
async def test_after_an_abandoned_step_every_batch_stays_within_k_and_the_overlap_goes_on(
    ahead: int,
) -> None:
    """Step 2 carries no signal: the weights do not change, and no later batch is more than K
    changes behind the weights it trains (none would be consumed as stale), while batches
    still run K ahead."""
    timeline = Timeline(0.001, 0.02, abandoned=frozenset({2}))
    await timeline.run(ahead, batches=10)
    lags = [timeline.behind(n) for n in range(1, 11)]
    assert max(lags) <= ahead
    assert lags[-4:] == [ahead] * 4


async def test_while_the_alias_lags_behind_a_refused_swap_admission_waits() -> None:
    """Step 2's adapter was refused: the weights moved but the alias still serves step 1's.
    Admission counts that lag, so no batch is trained more than K behind."""
    timeline = Timeline(0.001, 0.02, refused=frozenset({2}))
    await timeline.run(1, batches=8)
    assert max(timeline.behind(n) for n in range(1, 9)) <= 1


async def test_with_the_trainer_slower_rollouts_wait_for_admission() -> None:
    """Batch 1 and (K = 1) batch 2 start at once; every later one waits for a step."""
    timeline = Timeline(rollout_s=0.0, train_s=0.02)
    metrics = await timeline.run(1, batches=5)
    assert [timeline.sampled_by[n] for n in range(1, 6)] == [0, 0, 1, 2, 3]
    assert all(m["pipeline_admission_wait_s"] > 0 for m in metrics[2:])


async def test_a_failing_producer_fails_the_take_not_a_hang() -> None:
    async def produce(_number: int) -> tuple[list[TrainableGroup], dict[str, float]]:
        raise RuntimeError("the agent's module could not be imported")

    pipeline = Pipeline(produce, 1, 1, None)
    pipeline.start()
    with pytest.raises(RuntimeError, match="could not be imported"):
        await asyncio.wait_for(pipeline.take(), 5)
    await pipeline.aclose()


async def test_the_pipeline_makes_only_the_batches_asked_for() -> None:
    timeline = Timeline(rollout_s=0.0, train_s=0.01)
    await timeline.run(4, batches=3)
    assert sorted(timeline.sampled_by) == [1, 2, 3]
