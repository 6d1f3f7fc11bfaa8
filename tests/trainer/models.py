"""A tiny random Llama for the trainer's tests: fast on a CPU, real attention and LoRA targets."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(*, width: int = 32, vocabulary: int = 128, positions: int = 64) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=vocabulary,
            max_position_embeddings=positions,
        )
    )
