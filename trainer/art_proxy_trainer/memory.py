"""What one trainer step holds in memory, counted from a model's shape (no weights needed).

The same accounting gives the one-GPU arithmetic of docs/training.md and the figure `benchmarks/gpu_check.py`
measures against. It counts live tensors, largest first:

- the frozen base, `dtype_bytes` a parameter (bfloat16 on CUDA);
- the LoRA adapter in float32: its weights, their gradients and AdamW's two moments, 16 bytes a
  parameter;
- the activations autograd keeps for one micro-batch: with recomputation, each decoder layer's
  input plus one layer's full set while it is recomputed; without, every layer's full set. A
  layer's set per token: the norms' outputs, q/k/v/o, the MLP's gate, up, activation and product
  in the base's dtype, and the float32 copy of its input each LoRA module makes;
- the output layer's chunks: a float32 copy of the head's weight (when the base is not float32)
  and a few chunk-sized float32 tensors (logits, filtered, log-softmax, probabilities), twice over
  in the backward's recomputation.

It leaves out the CUDA context and allocator slack (~1-2 GB), and on a CPU what the C allocator
keeps after a free (resident memory can be several times the live tensors there).

`micro_batches` cuts a batch into row ranges of a token budget; a step that runs out of memory
tries again at half of it (`halved_micro_batch`).
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.scoring import CHUNK_BYTES

GB = 1e9
# Chunk-sized float32 tensors alive at once in the output layer (forward and recomputation).
_CHUNK_COPIES = 8


@dataclass(frozen=True)
class ModelShape:
    """A decoder's dimensions (a Llama/Qwen2-style model)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocabulary: int
    tied: bool  # the head shares the embedding's weight

    @classmethod
    def of(cls, config: Any, name: str = "") -> ModelShape:
        """From a transformers config."""
        return cls(
            name or str(getattr(config, "name_or_path", "") or config.model_type),
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            config.vocab_size,
            bool(getattr(config, "tie_word_embeddings", False)),
        )

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def parameters(self) -> int:
        h, i, kv = self.hidden, self.intermediate, self.kv_width
        layer = 2 * h * h + 2 * h * kv + (h + 2 * kv) + 3 * h * i + 2 * h
        embedding = self.vocabulary * h
        return self.layers * layer + embedding * (1 if self.tied else 2) + h

    def lora_parameters(self, rank: int) -> int:
        """LoRA on every linear projection of every layer (the trainer's default)."""
        h, i, kv = self.hidden, self.intermediate, self.kv_width
        per_layer = 2 * (h + h) + 2 * (h + kv) + 2 * (h + i) + (i + h)
        return self.layers * rank * per_layer

    def layer_activation_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """One decoder layer's saved tensors for `tokens` tokens."""
        h, i, kv = self.hidden, self.intermediate, self.kv_width
        in_dtype = 4 * h + 2 * kv + 4 * i
        lora_inputs_fp32 = 6 * h + i
        return tokens * (in_dtype * dtype_bytes + lora_inputs_fp32 * 4)


@dataclass(frozen=True)
class StepMemory:
    weights: int
    adapter: int
    activations: int
    output_layer: int

    @property
    def total(self) -> int:
        return self.weights + self.adapter + self.activations + self.output_layer


def step_memory(
    shape: ModelShape,
    *,
    micro_batch_tokens: int,
    recompute: bool = True,
    lora_rank: int = 8,
    dtype_bytes: int = 2,
) -> StepMemory:
    layer = shape.layer_activation_bytes(micro_batch_tokens, dtype_bytes)
    if recompute:
        activations = shape.layers * micro_batch_tokens * shape.hidden * dtype_bytes + layer
    else:
        activations = shape.layers * layer
    head_copy = 0 if dtype_bytes == 4 else shape.vocabulary * shape.hidden * 4
    return StepMemory(
        weights=shape.parameters * dtype_bytes,
        adapter=shape.lora_parameters(lora_rank) * 16,
        activations=activations,
        output_layer=head_copy + _CHUNK_COPIES * CHUNK_BYTES,
    )


# Public configs of the models the docs' one-GPU arithmetic is for (Qwen2/Qwen2.5 shapes).
QWEN2_0_5B = ModelShape("Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 151936, True)
QWEN2_7B = ModelShape("Qwen2.5-7B", 3584, 18944, 28, 28, 4, 152064, False)
QWEN2_14B = ModelShape("Qwen2.5-14B", 5120, 13824, 48, 40, 8, 152064, False)


def vllm_memory(shape: ModelShape, *, kv_cache_gb: float, dtype_bytes: int = 2) -> float:
    """vLLM's share in bytes: its copy of the weights, the KV cache it is given, and ~2 GB of
    CUDA graphs, activations and LoRA slots."""
    return shape.parameters * dtype_bytes + kv_cache_gb * GB + 2 * GB


# The CUDA context and allocator slack a process holds beyond its tensors.
CUDA_CONTEXT = 2 * GB
# vLLM's own default share, and the least KV cache worth serving with.
VLLM_DEFAULT_SHARE = 0.9
VLLM_LEAST_KV_CACHE_GB = 1.0


def vllm_share(
    shape: ModelShape,
    gpu_bytes: float,
    *,
    micro_batch_tokens: int,
    lora_rank: int = 8,
    sleeping: bool = False,
) -> float | None:
    """vLLM's `--gpu-memory-utilization` on one GPU the trainer trains on too: what the trainer's
    step leaves (with `sleeping`, vLLM sleeps through each step, so only what the trainer keeps
    between steps: its weights and adapter), at most vLLM's own 0.9, rounded down to a hundredth.
    None when vLLM's weights, graphs and 1 GB of KV cache do not fit in it."""
    step = step_memory(shape, micro_batch_tokens=micro_batch_tokens, lora_rank=lora_rank)
    trainer = (step.weights + step.adapter if sleeping else step.total) + CUDA_CONTEXT
    left = gpu_bytes - trainer
    if left < vllm_memory(shape, kv_cache_gb=VLLM_LEAST_KV_CACHE_GB):
        return None
    return min(VLLM_DEFAULT_SHARE, int(left / gpu_bytes * 100) / 100)


def release_freed_memory() -> None:
    """Hand the memory a step freed back to the system (glibc's `malloc_trim`; elsewhere a
    no-op). On a CPU, glibc keeps what a step's large tensors freed for reuse, and a process
    whose resident memory never shrinks is what an out-of-memory killer picks."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # musl and other C libraries: nothing to trim with
        return
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def micro_batches(batch: TrainingBatch, max_tokens: int) -> list[slice]:
    """Consecutive row ranges of at most ~max_tokens padded tokens each (0 = one range).

    Rows are right-padded to the batch's longest; a range is cut to its own longest row by the
    caller, so short rows together cost less than the whole batch's padding.
    """
    rows, length = batch.tokens_B_T.shape
    if max_tokens <= 0 or rows * length <= max_tokens:
        return [slice(0, rows)]
    lengths = batch.attention_mask_B_T.sum(dim=1).tolist()
    ranges: list[slice] = []
    start = 0
    longest = 0
    for row, row_length in enumerate(lengths):
        longest_with_row = max(longest, int(row_length))
        if row > start and longest_with_row * (row - start + 1) > max_tokens:
            ranges.append(slice(start, row))
            start, longest_with_row = row, int(row_length)
        longest = longest_with_row
    ranges.append(slice(start, rows))
    return ranges


def halved_micro_batch(max_tokens: int, batch: TrainingBatch) -> int:
    """Half the micro-batch size (0, one micro-batch, counts as the whole padded batch)."""
    rows, length = batch.tokens_B_T.shape
    return (max_tokens if max_tokens > 0 else rows * length) // 2
