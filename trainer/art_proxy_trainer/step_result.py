"""What one training step did: applied or abandoned (and why), its loss, gradient norm and
metrics, and the rows it could not train in full."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from art_proxy_trainer.loss import LossMetrics

AbandonReason = Literal["nan_loss", "nan_grad", "out_of_memory"]


@dataclass(frozen=True)
class StepResult:
    """A step's outcome. With several updates, `loss`, `grad_norm` and `metrics` are the means
    over its updates and `last_*` the last update's."""

    applied: bool  # False: the adapter is as it was before the step (see reason)
    reason: AbandonReason | None
    loss: float  # before the update; nan where it was the reason
    grad_norm: float  # before clipping; nan when not computed
    metrics: LossMetrics | None
    micro_batch_tokens: int = 0  # the micro-batch size that fit (0: the whole batch at once)
    too_long: tuple[str, ...] = ()  # trajectories of rows left out: one alone ran out of memory
    # Trajectories of rows that ran out of memory alone in a later update: trained by the
    # updates before it only.
    fewer_updates: tuple[str, ...] = ()
    updates: int = 1  # optimiser steps taken
    last_loss: float = math.nan
    last_metrics: LossMetrics | None = None

    def left_out(self, step: int) -> list[tuple[str, int, str]]:
        """The rows step `step` could not train in full, as (metric, rows, warning) that names
        their trajectories and the fix."""
        fix = "lower --micro-batch-tokens, turn on --gradient-checkpointing, or shorten them"
        kinds = (
            ("too_long_rows", self.too_long, "too long to fit in memory even alone: left out"),
            (
                "fewer_updates_rows",
                self.fewer_updates,
                "out of memory alone in a later update: trained by the updates before it only",
            ),
        )
        return [
            (
                metric,
                len(rows),
                f"step {step}: {len(rows)} sequence(s) {what} "
                f"(trajectories {', '.join(rows)}): {fix}",
            )
            for metric, rows, what in kinds
            if rows
        ]
