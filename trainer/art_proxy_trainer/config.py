"""The trainer's typed configuration: defaults that work, units and "0 = off" on each field, no I/O."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lora_rank: int = Field(8, ge=1, description="LoRA rank r.")
    lora_alpha: int = Field(16, gt=0, description="LoRA alpha (the update is scaled alpha/r).")
    target_modules: str | list[str] = Field(
        "all-linear", description='Modules given an adapter; "all-linear": every linear projection.'
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
    ratio_cap: float = Field(
        0.0,
        ge=0,
        description="Truncate the importance ratio at this value before clipping (bounds the "
        "term of negative-advantage tokens sampled by an older adapter); 0 = off.",
    )
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL to the base model (adapter off); 0 = off."
    )
    scale_advantages_by_std: bool = Field(
        False, description="Divide group advantages by the group's std (Dr. GRPO: off)."
    )
