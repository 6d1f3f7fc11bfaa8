"""The whole loop overlapped (`--max-off-policy-steps K`): the rollouts of later steps are sampled
while a step trains, and the trainer takes each batch as soon as it is ready.

Staleness is counted in changes of the weights (samples.py): a group sampled by the weights of
step a and trained into those of step p is as many steps behind as steps between them changed the
weights. An abandoned step (no signal, a NaN, every group stale) changes none, and a step whose
adapter the upstream refused changes the weights but not what the alias serves. So admission
reads both: batch i (the i-th step from now trains it) starts its rollouts once

    (weights changed - weights the alias serves) + (steps still to take before batch i) <= K,

the most that batch can be behind when it is trained, whatever the steps between do. Beyond that
its rollouts wait; they are neither trained staler nor thrown away. A batch the trainer is waiting
for is admitted whatever the bound says (waiting could only help if a swap lands, and none will
while the trainer waits): with the alias stuck behind refused swaps, its groups are consumed as
stale by the trainer's bound. With K = 0 this would alternate as `WholeLoop.run` does, which is
what K = 0 runs.

Validation is not a batch's: the loop runs it beside the batches, on the adapter it names
(loop.py). Each step records what the pipeline did: how long the trainer waited for its batch
(`pipeline_trainer_wait_s`), how long its rollouts waited for admission
(`pipeline_admission_wait_s`), how many steps were still to be taken before it when its rollouts
began (`pipeline_steps_ahead`, at most K: how far ahead they ran, not how stale they were) and how
many batches were ready when it was taken (`pipeline_queue_depth`); how far behind its groups
were is the step's staleness (samples.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from art_proxy.records import TrainableGroup

# Draws the groups of the batch for step `number` and the metrics of its rollouts.
Producer = Callable[[int], Awaitable[tuple[list[TrainableGroup], dict[str, float]]]]


@dataclass(frozen=True)
class Batch:
    """What one step trains on."""

    number: int
    groups: list[TrainableGroup]
    metrics: dict[str, float]


class Pipeline:
    """Batches made ahead of the trainer, never more than `max_off_policy_steps` changes of the
    weights behind those they are trained into.

    `take()` gives the batches in order; the trainer calls `stepped()` after each step, which
    may admit the next batch's rollouts. `batches`: how many to make in all (None: until closed)."""

    def __init__(
        self, produce: Producer, first: int, max_off_policy_steps: int, batches: int | None
    ) -> None:
        self._produce = produce
        self._first = first
        self._bound = max_off_policy_steps
        self._limit = batches
        self._steps = 0  # taken since the pipeline started
        self._moved = 0  # of those, steps that changed the weights
        self._served = 0  # of those, the last one whose weights the alias serves
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
        return batch

    def stepped(self, *, moved_weights: bool, served: bool) -> None:
        """A step was taken: `moved_weights`, it changed the weights (applied); `served`, the
        alias serves them now (its adapter swapped in)."""
        self._steps += 1
        self._moved += moved_weights
        if served:
            self._served = self._moved
        self._stepped.set()

    def behind_at_most(self, index: int) -> int:
        """How many changes of the weights batch `index`, sampled now, could be behind the
        weights it is trained into."""
        return (self._moved - self._served) + max(index - self._steps, 0)

    async def aclose(self) -> None:
        """Stop making batches; rollouts under way are cancelled (they finish their
        trajectories as cancelled: rollout.py)."""
        if self._task is not None:
            self._task.cancel()
            # A producer's own failure is what `take()` raised.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        index = 0
        while self._limit is None or index < self._limit:
            waiting = time.perf_counter()
            # Batch `index` is the one the trainer waits for once `index` steps are taken.
            while self.behind_at_most(index) > self._bound and self._steps < index:
                self._stepped.clear()
                await self._stepped.wait()
            admission_wait = time.perf_counter() - waiting
            ahead = max(index - self._steps, 0)
            groups, metrics = await self._produce(self._first + index)
            metrics["pipeline_admission_wait_s"] = admission_wait
            metrics["pipeline_steps_ahead"] = float(ahead)
            self._ready.put_nowait(Batch(self._first + index, groups, metrics))
            index += 1
