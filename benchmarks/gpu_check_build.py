"""`gpu_check.py`'s models and batches: a Qwen2-shaped model built from its config (no weights fetched), a GRPO batch of a given length."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from art_proxy_trainer.batch import SequenceStats, TrainingBatch
from art_proxy_trainer.bitmask import packed
from art_proxy_trainer.memory import ModelShape
from art_proxy_trainer.sampled import SamplingTransforms

TINY = ModelShape("tiny", 64, 128, 2, 4, 2, 1000, True)
console = Console(width=max(Console().width, 120))  # the table whole, in a log too


@dataclass(frozen=True)
class Row:
    model: str
    arm: str
    tokens_per_s: float | None  # None: it did not run (see note)
    peak_gb: float | None
    predicted_gb: float | None
    applied: bool
    note: str = ""  # the micro-batch size a step fell back to; why an arm did not run


def build(shape: ModelShape, device: torch.device, *, init_std: float = 0.02) -> Qwen2ForCausalLM:
    """A Qwen2-style model of `shape` with random weights (`init_std`: their spread), in
    bfloat16 on `device`."""
    config = Qwen2Config(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        vocab_size=shape.vocabulary,
        tie_word_embeddings=shape.tied,
        max_position_embeddings=4096,
        initializer_range=init_std,
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with device:
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.train(False)
    return model


def batch_of(
    shape: ModelShape,
    rows: int,
    prompt: int,
    completion: int,
    device: torch.device,
    sampling: Literal["none", "top_p", "every change"] = "none",
) -> TrainingBatch:
    length = prompt + completion
    generator = torch.Generator().manual_seed(0)
    tokens_B_T = torch.randint(0, shape.vocabulary, (rows, length), generator=generator)
    mask_B_T = torch.zeros(rows, length)
    mask_B_T[:, prompt:] = 1.0
    transforms = SamplingTransforms()
    if sampling != "none":
        transforms = SamplingTransforms(top_p_B_T=torch.where(mask_B_T > 0, 0.9, 1.0))
    if sampling == "every change":
        # What vLLM applies besides: a grammar's mask (every id but one), a logit bias, the
        # penalties from each row's prompt and output so far, min_p.
        trained = mask_B_T > 0
        positions_B_T = torch.arange(length).expand(rows, length).clone()
        transforms = replace(
            transforms,
            min_p_B_T=torch.where(trained, 0.001, 0.0),
            repetition_B_T=torch.where(trained, 1.1, 1.0),
            frequency_B_T=torch.where(trained, 0.2, 0.0),
            presence_B_T=torch.where(trained, 0.2, 0.0),
            call_start_B_T=torch.where(trained, prompt, positions_B_T),
            position_B_T=positions_B_T,
            bias_ids_B_T_M=torch.tensor([3, 40, -1]).expand(rows, length, 3).clone(),
            bias_B_T_M=torch.tensor([2.0, -3.0, 0.0]).expand(rows, length, 3).clone(),
            allowed_index_B_T=torch.where(trained, 0, -1),
            allowed_K_W=(
                packed(torch.arange(shape.vocabulary), shape.vocabulary)
                & ~packed(torch.tensor([5]), shape.vocabulary)
            )[None],
        )
    return TrainingBatch(
        tokens_B_T,
        torch.ones(rows, length, dtype=torch.int64),
        mask_B_T,
        # Near the model's own logprobs of random tokens under random weights (~ -log V).
        torch.full((rows, length), -float(torch.tensor(shape.vocabulary).log())) * mask_B_T,
        torch.linspace(-1.0, 1.0, rows),
        SequenceStats(rows),
        transforms,
    ).to(device)
