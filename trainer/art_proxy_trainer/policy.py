"""The policy being trained: the upstream's base model with a LoRA adapter, and its optimiser.

The base is loaded exactly as the local server loads it (same GGUF conversion, float32), so the
logprobs the trainer computes are those of the model that sampled the tokens, up to float noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from peft import PeftModel

from art_proxy.config import TrainerConfig
from art_proxy.local.model_loading import load_model
from art_proxy_trainer.step import lora_model, make_optimizer


@dataclass
class Policy:
    model: PeftModel
    optimizer: torch.optim.AdamW
    pad_token_id: int
    served_name: str  # the name the local server would serve it as
    names: set[str]  # every name an upstream may list it under (served name, source path)


def load_policy(model: str | None, config: TrainerConfig, *, seed: int) -> Policy:
    """Raises art_proxy.local.errors.ModelLoadError when the model cannot be loaded."""
    torch.manual_seed(seed)
    loaded = load_model(model)
    peft_model = lora_model(loaded.model, config)
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Policy(
        peft_model,
        make_optimizer(peft_model, config),
        int(pad or 0),
        loaded.default_name,
        {loaded.default_name, loaded.source},
    )
