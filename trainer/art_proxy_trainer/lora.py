"""The model the trainer trains: the base wrapped with a LoRA adapter (peft), the sampled-token
head installed (scoring.py), activations recomputed layer by layer where asked, and its optimiser."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

from art_proxy.config import TrainerConfig
from art_proxy_trainer.scoring import install_sampled_head


def lora_model(base: PreTrainedModel, config: TrainerConfig) -> PeftModel:
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        # peft reads the one string "all-linear" as every linear projection but the head.
        target_modules=(
            config.target_modules[0]
            if config.target_modules == ["all-linear"]
            else config.target_modules
        ),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft asks transformers a deprecated question (is_gradient_checkpointing) on every
        # wrap; the warning says nothing to a user of the trainer.
        warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
        model: PeftModel = get_peft_model(base, lora)
    if config.gradient_checkpointing:
        recompute_activations(model)
    install_sampled_head(model)
    return model


def decoder_layers(model: PeftModel) -> list[torch.nn.Module]:
    """The modules transformers keeps whole (its `_no_split_modules`): the decoder layers."""
    whole = set(getattr(model.get_base_model(), "_no_split_modules", None) or [])
    return [module for module in model.modules() if type(module).__name__ in whole]


def recompute_activations(model: PeftModel) -> None:
    """Gradient checkpointing with torch's own `checkpoint`, layer by layer. transformers' own
    switch acts in train mode only, and the trainer runs its forwards in eval mode."""
    for layer in decoder_layers(model):
        layer.forward = functools.partial(_recomputed, layer.forward)


def _recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def make_optimizer(model: PeftModel, config: TrainerConfig) -> torch.optim.AdamW:
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    return torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)
