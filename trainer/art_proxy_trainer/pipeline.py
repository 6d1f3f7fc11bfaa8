"""The whole loop overlapped (`--max-off-policy-steps K`): the rollouts of later steps are sampled
while a step trains, and the trainer takes each batch as soon as it is ready.

Batches are numbered from where the loop starts. Batch i (what the i-th step from now trains on)
is admitted, its rollouts started, once i - K steps have been taken: the alias then serves weights
at most K steps older than those batch i is trained into (a step's swap moves the alias before it
returns; an abandoned step moves neither), so no group is trained more than K steps off the
policy that sampled it. Beyond that rollouts wait (admission), they are neither trained staler nor
thrown away; the decoupled objective (`--objective tis`) corrects for the lag within the bound.
With K = 0 this would alternate as `WholeLoop.run` does, which is what K = 0 runs.

A batch's validation (every --val-every steps) is sampled with it, by the same adapter, so a
step's validation reward stays that of the policy that sampled its training rollouts, and it never
holds up a step. Each step records what the pipeline did: how long the trainer waited for its
batch (`pipeline_trainer_wait_s`), how long its rollouts waited for admission
(`pipeline_admission_wait_s`), how many batches were ready when it was taken
(`pipeline_queue_depth`), and how many steps were taken between its admission and its training
(`pipeline_lag_steps`, at most K).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from art_proxy.records import TrainableGroup

# Draws the groups of the batch for step `number` (validation included when it is due) and the
# metrics of its rollouts.
Producer = Callable[[int], Awaitable[tuple[list[TrainableGroup], dict[str, float]]]]


@dataclass(frozen=True)
class Batch:
    """What one step trains on, and when it was made."""

    number: int
    groups: list[TrainableGroup]
    metrics: dict[str, float]
    admitted_after: int  # steps taken when its rollouts began


class Pipeline:
    """Batches made ahead of the trainer, at most `max_off_policy_steps` steps ahead.

    `take()` gives the batches in order; the trainer calls `stepped()` after each step, which
    admits the next batch's rollouts. `batches`: how many to make in all (None: until closed)."""

    def __init__(
        self, produce: Producer, first: int, max_off_policy_steps: int, batches: int | None
    ) -> None:
        self._produce = produce
        self._first = first
        self._ahead = max_off_policy_steps
        self._limit = batches
        self._steps = 0  # taken since the pipeline started
        self._stepped = asyncio.Event()
        self._ready: asyncio.Queue[Batch] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="art-proxy-rollout-pipeline")

    async def take(self) -> Batch:
        """The next batch, once made; what failed the producer is raised here."""
        assert self._task is not None, "start() first"
        taking = asyncio.ensure_future(self._ready.get())
        waiting = time.perf_counter()
        done, _ = await asyncio.wait({taking, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if taking not in done:
            taking.cancel()
            self._task.result()  # raises the producer's error
            raise RuntimeError("the rollout pipeline stopped before its last batch")
        batch = taking.result()
        batch.metrics["pipeline_trainer_wait_s"] = time.perf_counter() - waiting
        batch.metrics["pipeline_queue_depth"] = float(self._ready.qsize() + 1)
        batch.metrics["pipeline_lag_steps"] = float(self._steps - batch.admitted_after)
        return batch

    def stepped(self) -> None:
        """A step was taken (applied or not): the next batch may be admitted."""
        self._steps += 1
        self._stepped.set()

    async def aclose(self) -> None:
        """Stop making batches; rollouts under way are cancelled (their groups stay in the
        store, unconsumed)."""
        if self._task is not None:
            self._task.cancel()
            # A producer's own failure is what `take()` raised.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        index = 0
        while self._limit is None or index < self._limit:
            waiting = time.perf_counter()
            while self._steps < index - self._ahead:
                self._stepped.clear()
                await self._stepped.wait()
            admission_wait = time.perf_counter() - waiting
            admitted_after = self._steps
            groups, metrics = await self._produce(self._first + index)
            metrics["pipeline_admission_wait_s"] = admission_wait
            self._ready.put_nowait(Batch(self._first + index, groups, metrics, admitted_after))
            index += 1
