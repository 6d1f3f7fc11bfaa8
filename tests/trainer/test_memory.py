"""The memory arithmetic counts what a model holds: its parameters and its adapter's."""

from __future__ import annotations

import torch

from art_proxy.config import TrainerConfig
from art_proxy_trainer.lora import lora_model
from art_proxy_trainer.memory import (
    QWEN2_0_5B,
    QWEN2_7B,
    QWEN2_14B,
    ModelShape,
    step_memory,
    vllm_share,
)
from benchmarks.gpu_check_build import TINY, build


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


def test_vllm_s_share_of_one_gpu_is_what_the_trainer_s_step_leaves() -> None:
    """`up --engine vllm --agent` on one GPU (the one-GPU table in docs/training.md)."""

    def share(shape: ModelShape, gb: int, *, sleeping: bool = False) -> float | None:
        return vllm_share(shape, gb * 1e9, micro_batch_tokens=8192, sleeping=sleeping)

    assert share(QWEN2_0_5B, 80) == 0.9  # vLLM's own default: the trainer needs ~5 GB
    assert share(QWEN2_7B, 80) == 0.69
    assert share(QWEN2_14B, 80) == 0.46
    # Two bf16 copies of 7B's weights are 30 GB: no share of 24 GB fits, asleep or not.
    assert share(QWEN2_7B, 24) is None and share(QWEN2_7B, 24, sleeping=True) is None
    # vLLM asleep through each step leaves the trainer only its weights to keep between them.
    assert share(QWEN2_14B, 80, sleeping=True) == 0.59
