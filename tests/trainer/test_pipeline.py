"""The overlapped whole loop's pipeline: batches made ahead of the trainer, never more than K
steps ahead of the weights they are trained into."""

from __future__ import annotations

import asyncio

import pytest

from art_proxy.records import TrainableGroup
from art_proxy_trainer.pipeline import Pipeline


class Timeline:
    """A producer and a trainer of set speeds, and what each saw: for each batch, the steps
    taken when its rollouts began and when it was trained."""

    def __init__(self, rollout_s: float, train_s: float) -> None:
        self.rollout_s, self.train_s = rollout_s, train_s
        self.steps = 0
        self.began: dict[int, int] = {}
        self.trained: dict[int, int] = {}

    async def produce(self, number: int) -> tuple[list[TrainableGroup], dict[str, float]]:
        self.began[number] = self.steps
        await asyncio.sleep(self.rollout_s)
        return [], {}

    async def run(self, ahead: int, batches: int) -> list[dict[str, float]]:
        pipeline = Pipeline(self.produce, 1, ahead, batches)
        pipeline.start()
        metrics = []
        try:
            for _ in range(batches):
                batch = await pipeline.take()
                self.trained[batch.number] = self.steps
                await asyncio.sleep(self.train_s)
                self.steps += 1
                pipeline.stepped()
                metrics.append(batch.metrics)
        finally:
            await pipeline.aclose()
        return metrics


@pytest.mark.parametrize("ahead", [1, 2, 4])
@pytest.mark.parametrize(("rollout_s", "train_s"), [(0.001, 0.02), (0.02, 0.001), (0.01, 0.01)])
async def test_no_batch_is_trained_more_than_k_steps_after_its_rollouts_began(
    ahead: int, rollout_s: float, train_s: float
) -> None:
    timeline = Timeline(rollout_s, train_s)
    metrics = await timeline.run(ahead, batches=8)
    lags = [timeline.trained[n] - timeline.began[n] for n in range(1, 9)]
    assert max(lags) <= ahead
    assert [m["pipeline_lag_steps"] for m in metrics] == [float(lag) for lag in lags]
    if rollout_s < train_s:  # the rollouts run ahead as far as the bound lets them
        assert max(lags) == ahead
        # K = 1: the next batch samples while a step trains; from K = 2, batches wait ready.
        assert max(m["pipeline_queue_depth"] for m in metrics) == ahead


async def test_with_the_trainer_slower_rollouts_wait_for_admission() -> None:
    """Batch 1 and (K = 1) batch 2 start at once; every later one waits for a step."""
    timeline = Timeline(rollout_s=0.0, train_s=0.02)
    metrics = await timeline.run(1, batches=5)
    assert [timeline.began[n] for n in range(1, 6)] == [0, 0, 1, 2, 3]
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
    assert sorted(timeline.began) == [1, 2, 3]
