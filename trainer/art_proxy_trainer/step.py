"""One optimisation step of GRPO on a peft LoRA adapter.

The reference policy for the KL is the base model, obtained by switching the adapter off for a
no-grad forward pass, so no second copy of the weights is held. The forward passes run in eval mode:
dropout would make pi_theta a different policy from the one that sampled the recorded logprobs. A
step whose loss or gradient norm is not finite, or that runs out of memory, is abandoned before the
optimiser moves and is returned as data with its reason; the adapter is left as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.config import TrainerConfig
from art_proxy_trainer.loss import LossMetrics, grpo_loss, token_logprobs

AbandonReason = Literal["nan_loss", "nan_grad", "out_of_memory"]


@dataclass(frozen=True)
class StepResult:
    applied: bool  # False: the optimiser did not move (see reason)
    reason: AbandonReason | None
    loss: float  # before the update; nan where it was the reason
    grad_norm: float  # before clipping; nan when not computed
    metrics: LossMetrics | None


def lora_model(base: PreTrainedModel, config: TrainerConfig) -> PeftModel:
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=config.target_modules,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    model: PeftModel = get_peft_model(base, lora)
    return model


def make_optimizer(model: PeftModel, config: TrainerConfig) -> torch.optim.AdamW:
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    return torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)


def _logprobs(model: PeftModel, batch: TrainingBatch) -> torch.Tensor:
    logits_B_T_V: torch.Tensor = model(
        input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T
    ).logits
    return token_logprobs(logits_B_T_V, batch.tokens_B_T)


def _abandon(
    optimizer: torch.optim.Optimizer,
    reason: AbandonReason,
    loss: float = math.nan,
    grad_norm: float = math.nan,
    metrics: LossMetrics | None = None,
) -> StepResult:
    optimizer.zero_grad(set_to_none=True)
    return StepResult(False, reason, loss, grad_norm, metrics)


def train_step(
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    batch: TrainingBatch,
    config: TrainerConfig,
) -> StepResult:
    model.eval()
    optimizer.zero_grad(set_to_none=True)
    try:
        ref_logprobs_B_T = None
        if config.kl_coef > 0:
            with torch.no_grad(), model.disable_adapter():
                ref_logprobs_B_T = _logprobs(model, batch)
        result = grpo_loss(
            _logprobs(model, batch),
            batch.old_logprobs_B_T,
            batch.advantages_B,
            batch.mask_B_T,
            eps_low=config.eps_low,
            eps_high=config.eps_high,
            ratio_cap=config.ratio_cap,
            kl_coef=config.kl_coef,
            ref_logprobs_B_T=ref_logprobs_B_T,
        )
        loss = float(result.loss.detach())
        if not math.isfinite(loss):
            return _abandon(optimizer, "nan_loss", loss, metrics=result.metrics)
        torch.autograd.backward(result.loss)
    except torch.OutOfMemoryError:
        return _abandon(optimizer, "out_of_memory")
    trainable = [p for group in optimizer.param_groups for p in group["params"]]
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, max_norm))
    if not math.isfinite(grad_norm):
        return _abandon(optimizer, "nan_grad", loss, grad_norm, result.metrics)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(True, None, loss, grad_norm, result.metrics)
