"""The token-level clipped GRPO objective (DAPO's clip-higher, Dr. GRPO's aggregation).

Per sampled token: `rho = exp(logp - old_logp)` and `min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)`,
averaged over every masked token of the batch (a token-level mean, so a long trajectory is not
down-weighted per token). `ratio_cap` truncates rho before the objective: without it a token whose
advantage is negative and whose ratio has drifted far up (an older adapter sampled it) has an
unbounded term. The optional KL to the reference uses the k3 estimator
`exp(ref - logp) - (ref - logp) - 1`, which is >= 0 and unbiased. Everything is computed in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossMetrics:
    clip_fraction: float  # masked tokens whose clipped term won the min
    mean_ratio: float
    kl: float  # mean k3 over masked tokens; 0 without reference logprobs
    tokens: int


@dataclass(frozen=True)
class LossResult:
    loss: torch.Tensor  # scalar, to minimise
    metrics: LossMetrics


def token_logprobs(
    logits_B_T_V: torch.Tensor,
    tokens_B_T: torch.Tensor,
    temperatures_B_T: torch.Tensor | None = None,
) -> torch.Tensor:
    """logprobs_B_T[b, t] = log p(tokens[b, t] | tokens[b, :t]); position 0 has no prediction: 0.

    With `temperatures_B_T`, token t is scored from the logits divided by its temperature (the
    distribution it was sampled from). The only full-vocabulary tensor beyond the logits is
    log_softmax's own output (plus the fp32 cast, or the division); the gather keeps one value per
    position.
    """
    logits_B_Tm1_V = logits_B_T_V[:, :-1].float()
    if temperatures_B_T is not None:
        # The logits at t-1 predict token t: they take token t's temperature.
        logits_B_Tm1_V = logits_B_Tm1_V / temperatures_B_T[:, 1:].unsqueeze(-1)
    logprobs_B_Tm1_V = torch.log_softmax(logits_B_Tm1_V, dim=-1)
    predicted_B_Tm1 = logprobs_B_Tm1_V.gather(-1, tokens_B_T[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(predicted_B_Tm1, (1, 0))


def grpo_loss(
    logprobs_B_T: torch.Tensor,
    old_logprobs_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    ratio_cap: float = 0.0,
    kl_coef: float = 0.0,
    ref_logprobs_B_T: torch.Tensor | None = None,
) -> LossResult:
    """The loss to minimise (minus the objective, plus kl_coef * KL); ratio_cap 0 = off."""
    mask_B_T = mask_B_T.float()
    trained_B_T = mask_B_T > 0
    tokens = mask_B_T.sum().clamp(min=1.0)
    # Context and padding positions may hold anything: keep them out of exp, where an overflow
    # would turn into inf * 0 = nan.
    log_ratio_B_T = torch.where(trained_B_T, logprobs_B_T.float() - old_logprobs_B_T.float(), 0.0)
    ratio_B_T = torch.exp(log_ratio_B_T)
    if ratio_cap > 0:
        ratio_B_T = ratio_B_T.clamp(max=ratio_cap)
    advantages_B_1 = advantages_B.float().unsqueeze(-1)
    unclipped_B_T = ratio_B_T * advantages_B_1
    clipped_B_T = ratio_B_T.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages_B_1
    objective_B_T = torch.minimum(unclipped_B_T, clipped_B_T)
    loss = -(objective_B_T * mask_B_T).sum() / tokens

    kl = torch.zeros((), dtype=torch.float32, device=logprobs_B_T.device)
    if ref_logprobs_B_T is not None:
        ref_log_ratio_B_T = torch.where(
            trained_B_T, ref_logprobs_B_T.float() - logprobs_B_T.float(), 0.0
        )
        k3_B_T = torch.exp(ref_log_ratio_B_T) - ref_log_ratio_B_T - 1.0
        kl = (k3_B_T * mask_B_T).sum() / tokens
        loss = loss + kl_coef * kl

    with torch.no_grad():
        clipped = (clipped_B_T < unclipped_B_T).float() * mask_B_T
        metrics = LossMetrics(
            clip_fraction=float(clipped.sum() / tokens),
            mean_ratio=float((ratio_B_T * mask_B_T).sum() / tokens),
            kl=float(kl),
            tokens=int(mask_B_T.sum()),
        )
    return LossResult(loss, metrics)
