"""The memory arithmetic counts what a model holds: its parameters and its adapter's."""

from __future__ import annotations

import torch

from art_proxy.config import TrainerConfig
from art_proxy_trainer.memory import QWEN2_0_5B, QWEN2_7B, QWEN2_14B, step_memory
from art_proxy_trainer.step import lora_model
from benchmarks.gpu_check import TINY, build


def test_the_shape_counts_a_built_model_s_parameters_and_its_adapter() -> None:
    model = build(TINY, torch.device("cpu"))
    assert TINY.parameters == sum(p.numel() for p in model.parameters())
    adapted = lora_model(model, TrainerConfig())
    trained = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert TINY.lora_parameters(8) == trained


def test_the_published_models_have_their_published_sizes() -> None:
    assert round(QWEN2_0_5B.parameters / 1e9, 2) == 0.49
    assert round(QWEN2_7B.parameters / 1e9, 1) == 7.6
    assert round(QWEN2_14B.parameters / 1e9, 1) == 14.8


def test_recomputed_activations_are_what_lets_7b_train_beside_vllm_on_80_gb() -> None:
    kept = step_memory(QWEN2_7B, micro_batch_tokens=8192, recompute=False)
    recomputed = step_memory(QWEN2_7B, micro_batch_tokens=8192, recompute=True)
    assert recomputed.total < 40e9 < kept.total
