"""The GRPO algorithm's knobs (`TrainerConfig`): the adapter, the optimiser, the loss and its
corrections, memory. They live here, not in the trainer, so the CLI can offer the trainer's flags
without importing torch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from art_proxy.config.shared import Settings


class TrainerConfig(Settings):
    """The GRPO algorithm's knobs (the trainer's core reads only these)."""

    lora_rank: int = Field(8, ge=1, description="LoRA rank r.")
    lora_alpha: int = Field(16, gt=0, description="LoRA alpha (the update is scaled alpha/r).")
    target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        description='Modules given an adapter (repeat the flag); "all-linear": every linear '
        "projection.",
    )
    learning_rate: float = Field(
        2e-4,
        gt=0,
        description="AdamW step size (LoRA wants ~10x a full fine-tune's; 2e-4 learned a "
        "single-word task in ~10 steps on SmolLM2-135M).",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay; 0 = off.")
    max_grad_norm: float = Field(1.0, ge=0, description="Clip the global L2 grad norm; 0 = off.")
    eps_low: float = Field(0.2, ge=0, lt=1, description="Lower clip: rho >= 1 - eps_low.")
    eps_high: float = Field(
        0.28, ge=0, description="Upper clip (clip-higher): rho <= 1 + eps_high."
    )
    objective: Literal["tis", "mis", "ppo"] = Field(
        "tis",
        description="How tokens sampled by other weights or numerics (an older adapter, vLLM in "
        "bf16) are corrected: tis, clip against the trainer's own weights and weight each token "
        "by pi_trainer/pi_sampler truncated at --is-cap; mis, the same weight but tokens beyond "
        "[1/--is-cap, --is-cap] left out; ppo, clip pi_trainer/pi_sampler itself (exact only on "
        "fresh data sampled at the trainer's numerics).",
    )
    is_cap: float = Field(
        2.0,
        gt=1,
        description="tis/mis: the bound on a token's importance weight pi_trainer/pi_sampler.",
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        le=16,
        description="tis/mis: optimiser steps on each batch, clipped against the trainer's "
        "weights before the first (the proximal policy, as decoupled PPO does): more learning "
        "from each batch, as production data that the trainer did not sample needs.",
    )
    ratio_cap: float = Field(
        3.0,
        ge=0,
        description="ppo: truncate the importance ratio at this value before clipping (bounds the "
        "term of negative-advantage tokens sampled by an older adapter); 0 = off.",
    )
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL to the base model (adapter off); 0 = off."
    )
    scale_advantages_by_std: bool = Field(
        False, description="Divide group advantages by the group's std (Dr. GRPO: off)."
    )
    teacher_weight: float = Field(
        1.0,
        ge=0,
        description="With --teacher: the weight of the teacher's per-token term, log p_teacher "
        "minus the sampler's recorded logprob of each sampled token (on-policy distillation), "
        "added to the group advantage.",
    )
    group_advantage: bool = Field(
        True,
        description="Train on the group-relative reward advantage (GRPO). --no-group-advantage "
        "with --teacher: the teacher's term alone (on-policy distillation without rewards).",
    )
    micro_batch_tokens: int = Field(
        8192,
        ge=0,
        description="Tokens per forward/backward pass (rows are accumulated in chunks of about "
        "this many padded tokens); 0 = the whole batch at once.",
    )
    gradient_checkpointing: bool = Field(
        True,
        description="Recompute each decoder layer's activations in the backward instead of "
        "keeping them: the same gradients for about a third more compute, and a step's memory "
        "a fraction of what kept activations take (--no-gradient-checkpointing: keep them).",
    )
    base_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="The frozen base model's dtype: auto, bfloat16 on CUDA and float32 on a CPU. "
        "The LoRA weights, the optimiser, the output layer and the log-softmax stay float32; "
        "bfloat16 is for CUDA only.",
    )

    @model_validator(mode="after")
    def _several_updates_need_a_proximal(self) -> TrainerConfig:
        if self.objective == "ppo" and self.updates_per_batch > 1:
            raise ValueError(
                f"--updates-per-batch {self.updates_per_batch} is for --objective tis or mis: "
                "ppo clips against the sampler, which does not bound a second update"
            )
        return self
