"""One optimisation step of GRPO on a peft LoRA adapter.

The reference policy for the KL is the base model, obtained by switching the adapter off for a
no-grad forward pass, so no second copy of the weights is held. The forward passes run in eval mode:
dropout would make pi_theta a different policy from the one that sampled the recorded logprobs. A
step whose loss or gradient norm is not finite is abandoned before the optimiser moves and is
returned as data with its reason; the adapter is left as it was. With several updates per batch,
an update abandoned after others moved the weights puts the adapter and the optimiser's state back
where the step began (a LoRA adapter and its moments are small enough to copy), so an abandoned step
never leaves weights in memory that differ from both the checkpoint and what the server serves.

Memory adapts: a micro-batch that runs out of memory is halved until it fits, the size that fit is
handed back for the next step to start from (so no step retries sizes that failed before), and a
row that does not fit even alone is left out of the step, its trajectory named in the result,
instead of abandoning the step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import torch
from peft import PeftModel

from art_proxy.config import TrainerConfig
from art_proxy_trainer.advantages import token_advantages
from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.loss import Correction, LossMetrics, grpo_loss, sft_loss
from art_proxy_trainer.memory import halved_micro_batch, micro_batches
from art_proxy_trainer.scoring import (
    score_sampled,
)
from art_proxy_trainer.step_result import AbandonReason, StepResult


def correction(config: TrainerConfig) -> Correction:
    return Correction(config.objective, config.is_cap, config.ratio_cap)


def _abandon(
    optimizer: torch.optim.Optimizer,
    reason: AbandonReason,
    loss: float = math.nan,
    grad_norm: float = math.nan,
    metrics: LossMetrics | None = None,
) -> StepResult:
    optimizer.zero_grad(set_to_none=True)
    return StepResult(False, reason, loss, grad_norm, metrics)


class _PassOutOfMemory(Exception):
    """A micro-batch ran out of memory; `rows` are the batch's rows it held."""

    def __init__(self, rows: slice) -> None:
        super().__init__(f"rows {rows.start}-{rows.stop - 1} ran out of memory")
        self.rows = rows


@dataclass(frozen=True)
class Lockstep:
    """How one rank of several (distributed.py) accumulates its share of a batch in step with the
    others: every rank makes the same number of forward passes (a sharded model gathers its
    weights in each), the gradients are averaged across ranks in the last backward only, and the
    numbers of the step are summed across ranks before anything is decided on them."""

    forward: torch.nn.Module  # the module whose backward reduces gradients (DDP or FSDP2)
    total_tokens: int  # trained tokens of the whole batch, across ranks
    passes: int  # forward passes every rank makes
    filler: TrainingBatch  # one row to pass with weight 0 when this rank has no more rows
    syncing: Callable[[bool], AbstractContextManager[None]]  # reduce gradients in this backward?
    summed: Callable[[list[float]], list[float]]  # the values summed over the ranks
    world_size: int


def _accumulate(
    model: PeftModel,
    batch: TrainingBatch,
    config: TrainerConfig,
    max_tokens: int,
    lockstep: Lockstep | None = None,
    proximal: _Proximal | None = None,
) -> tuple[float, LossMetrics]:
    """Backward every micro-batch; returns the batch loss and its metrics (token-weighted).

    Each micro-batch's loss is a mean over its own masked tokens; weighting it by its share of the
    batch's tokens makes the accumulated gradient that of the token-level mean over the batch.
    Ranks average their gradients, so each weights its share by the number of ranks too. A pass
    that runs out of memory raises _PassOutOfMemory with its rows (not in lockstep: there the
    error ends the run).
    """
    total_tokens = max(lockstep.total_tokens if lockstep else batch.trained_tokens, 1)
    passes: list[tuple[TrainingBatch, slice]] = [
        (batch, rows) for rows in micro_batches(batch, max_tokens) if batch.tokens_B_T.shape[0]
    ]
    if lockstep is not None:
        passes += [(lockstep.filler, slice(0, 1))] * (lockstep.passes - len(passes))
    forward = lockstep.forward if lockstep else model
    scale = lockstep.world_size if lockstep else 1
    loss_sum = 0.0
    means_sum = [0.0] * len(LossMetrics(0, 0, 0, 0).means())
    for index, (source, rows) in enumerate(passes):
        share = float(source.mask_B_T[rows].sum()) / total_tokens if source is batch else 0.0
        if share == 0 and lockstep is None:
            continue
        try:
            loss, metrics = _backward_pass(
                model,
                forward,
                source,
                rows,
                config,
                share * scale,
                lockstep,
                index == len(passes) - 1,
                proximal if source is batch else None,
            )
        except torch.OutOfMemoryError as exc:
            if lockstep is not None:
                raise
            raise _PassOutOfMemory(rows) from exc
        if not math.isfinite(loss) and lockstep is None:
            return loss, metrics
        if share:
            loss_sum += loss * share
            means_sum = [
                total + mean * share for total, mean in zip(means_sum, metrics.means(), strict=True)
            ]
    if lockstep is not None:
        loss_sum, *means_sum = lockstep.summed([loss_sum, *means_sum])
    tokens = lockstep.total_tokens if lockstep else batch.trained_tokens
    return loss_sum, LossMetrics.from_means(means_sum, tokens)


def _backward_pass(
    model: PeftModel,
    forward: torch.nn.Module,
    source: TrainingBatch,
    rows: slice,
    config: TrainerConfig,
    weight: float,
    lockstep: Lockstep | None,
    last: bool,
    proximal: _Proximal | None = None,
) -> tuple[float, LossMetrics]:
    """One micro-batch's forward and backward (its loss weighted by `weight`)."""
    length = int(source.attention_mask_B_T[rows].sum(dim=1).max())
    tokens_B_T = source.tokens_B_T[rows, :length]
    attention_B_T = source.attention_mask_B_T[rows, :length]
    mask_B_T = source.mask_B_T[rows, :length]
    transforms = source.transforms.rows(rows, length)
    ref_logprobs_B_T = None
    if config.kl_coef > 0 and source.objective == "grpo":
        with torch.no_grad(), model.disable_adapter():
            ref_logprobs_B_T = score_sampled(
                model, tokens_B_T, attention_B_T, mask_B_T, transforms
            ).logprobs_B_T
    with lockstep.syncing(last) if lockstep else contextlib.nullcontext():
        scored = score_sampled(forward, tokens_B_T, attention_B_T, mask_B_T, transforms)
        if source.objective == "sft":
            result = sft_loss(scored.logprobs_B_T, mask_B_T, scored.entropy_B_T)
        else:
            prox_B_T = None
            if proximal is not None and proximal.filled:
                prox_B_T = proximal.logprobs_B_T[rows, :length]
            elif proximal is not None:
                proximal.logprobs_B_T[rows, :length] = scored.logprobs_B_T.detach().float()
            old_B_T = source.old_logprobs_B_T[rows, :length]
            advantages = source.advantages_B[rows]
            if source.teacher_logprobs_B_T is not None:
                advantages = token_advantages(
                    advantages,
                    source.teacher_logprobs_B_T[rows, :length],
                    old_B_T,
                    teacher_weight=config.teacher_weight,
                    group_weight=1.0 if config.group_advantage else 0.0,
                )
            result = grpo_loss(
                scored.logprobs_B_T,
                old_B_T,
                advantages,
                mask_B_T,
                eps_low=config.eps_low,
                eps_high=config.eps_high,
                correction=correction(config),
                kl_coef=config.kl_coef,
                ref_logprobs_B_T=ref_logprobs_B_T,
                entropy_B_T=scored.entropy_B_T,
                prox_logprobs_B_T=prox_B_T,
            )
        loss = float(result.loss.detach())
        if not math.isfinite(loss) and lockstep is None:
            return loss, result.metrics
        torch.autograd.backward(result.loss * weight)
    return loss, result.metrics


@dataclass
class _Proximal:
    """The batch's logprobs under the weights before its first update (decoupled PPO's proximal
    policy): written by the first update's passes, read by the later ones."""

    logprobs_B_T: torch.Tensor
    filled: bool = False


def train_step(
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    batch: TrainingBatch,
    config: TrainerConfig,
    lockstep: Lockstep | None = None,
    *,
    micro_batch_tokens: int | None = None,
    fresh_optimizer: bool = False,
) -> StepResult:
    """The optimiser steps on `batch` (`config.updates_per_batch` of them, each clipped against
    the weights before the first; with `lockstep`: this rank's share of the whole batch),
    starting from `micro_batch_tokens` (None: the configured size; give back the result's to
    start where the last step's fit). `fresh_optimizer` clears the optimiser's state first (the
    first GRPO step after a warm start: its moments point the way the demonstrations pulled)."""
    model.eval()
    if fresh_optimizer:
        optimizer.state.clear()
    for group in optimizer.param_groups:
        group["lr"] = config.learning_rate  # a warm start's steps take their own
    batch = batch.to(next(model.parameters()).device)
    max_tokens = config.micro_batch_tokens if micro_batch_tokens is None else micro_batch_tokens
    updates = config.updates_per_batch if batch.objective == "grpo" else 1
    if config.objective == "ppo":
        updates = 1  # clipped against the sampler: a second update would not be bounded by it
    proximal = (
        _Proximal(torch.zeros_like(batch.old_logprobs_B_T, dtype=torch.float32))
        if updates > 1
        else None
    )
    start = _StepStart.of(optimizer) if updates > 1 else None
    done: list[StepResult] = []
    too_long: tuple[str, ...] = ()  # rows no update trained
    fewer_updates: tuple[str, ...] = ()  # rows left out after the first update
    for _ in range(updates):
        result, batch = _update(model, optimizer, batch, config, lockstep, max_tokens, proximal)
        max_tokens = result.micro_batch_tokens or max_tokens
        if not result.applied:
            if start is not None and done:
                start.restore(optimizer)
            left_out = too_long + fewer_updates + result.too_long  # nothing kept was trained
            return replace(result, too_long=left_out)
        if done:
            fewer_updates += result.too_long
        else:
            too_long += result.too_long
        done.append(result)
        if proximal is not None:
            proximal.filled = True
    return _combined(done, max_tokens, too_long, fewer_updates)


def _combined(
    updates: list[StepResult],
    max_tokens: int,
    too_long: tuple[str, ...],
    fewer_updates: tuple[str, ...],
) -> StepResult:
    """One result for the updates of a step: the means over them, and the last one's."""
    last = updates[-1]
    measured = [update.metrics for update in updates if update.metrics is not None]
    return StepResult(
        applied=True,
        reason=None,
        loss=math.fsum(update.loss for update in updates) / len(updates),
        grad_norm=math.fsum(update.grad_norm for update in updates) / len(updates),
        metrics=LossMetrics.averaged(measured) if measured else None,
        micro_batch_tokens=max_tokens,
        too_long=too_long,
        fewer_updates=fewer_updates,
        updates=len(updates),
        last_loss=last.loss,
        last_metrics=last.metrics,
    )


@dataclass(frozen=True)
class _StepStart:
    """The trainable weights and the optimiser's state where a step began, to put back when an
    update after the first is abandoned (sharded parameters copy shard by shard)."""

    weights: list[torch.Tensor]
    state: dict[torch.Tensor, dict[str, Any]]

    @classmethod
    def of(cls, optimizer: torch.optim.Optimizer) -> _StepStart:
        return cls(
            [p.detach().clone() for p in _trained(optimizer)],
            {
                parameter: {
                    name: value.clone() if isinstance(value, torch.Tensor) else value
                    for name, value in state.items()
                }
                for parameter, state in optimizer.state.items()
            },
        )

    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for parameter, weight in zip(_trained(optimizer), self.weights, strict=True):
                parameter.copy_(weight)
        optimizer.state.clear()
        optimizer.state.update(self.state)


def _trained(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [parameter for group in optimizer.param_groups for parameter in group["params"]]


def _update(
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    batch: TrainingBatch,
    config: TrainerConfig,
    lockstep: Lockstep | None,
    max_tokens: int,
    proximal: _Proximal | None,
) -> tuple[StepResult, TrainingBatch]:
    """One optimiser step on `batch`; the batch it was taken on (rows that did not fit alone
    left out)."""
    too_long: list[str] = []
    while True:
        optimizer.zero_grad(set_to_none=True)
        try:
            loss, metrics = _accumulate(model, batch, config, max_tokens, lockstep, proximal)
            break
        except _PassOutOfMemory as failed:
            # Smaller micro-batches give the same gradient in less memory: halve them until
            # every row is its own micro-batch; a row that does not fit alone is left out.
            # Ranks in lockstep cannot redo a pass alone: the error ends the run (the launcher
            # stops every rank) and the next start resumes from the last checkpoint.
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            rows = failed.rows
            if rows.stop - rows.start > 1:
                max_tokens = halved_micro_batch(max_tokens, batch)
                continue
            too_long.append(batch.trajectory_ids[rows.start] if batch.trajectory_ids else "")
            kept = [row for row in range(batch.tokens_B_T.shape[0]) if row != rows.start]
            if not kept or batch.take(kept).trained_tokens == 0:
                abandoned = _abandon(optimizer, "out_of_memory")
                return replace(abandoned, too_long=tuple(too_long)), batch
            batch = batch.take(kept)
            if proximal is not None:
                proximal.logprobs_B_T = proximal.logprobs_B_T[kept]
    if not math.isfinite(loss):
        abandoned = _abandon(optimizer, "nan_loss", loss, metrics=metrics)
        return replace(abandoned, micro_batch_tokens=max_tokens, too_long=tuple(too_long)), batch
    trainable = _trained(optimizer)
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    grad_norm = _value(torch.nn.utils.clip_grad_norm_(trainable, max_norm))
    if not math.isfinite(grad_norm):
        abandoned = _abandon(optimizer, "nan_grad", loss, grad_norm, metrics)
        return replace(abandoned, micro_batch_tokens=max_tokens, too_long=tuple(too_long)), batch
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(True, None, loss, grad_norm, metrics, max_tokens, tuple(too_long)), batch


def _value(norm: torch.Tensor) -> float:
    """A norm as a number; a sharded model's is a DTensor whose reduction every rank joins."""
    full_tensor = getattr(norm, "full_tensor", None)
    return float(full_tensor() if full_tensor is not None else norm)
