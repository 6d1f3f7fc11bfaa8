"""The token-level clipped GRPO objective (DAPO's clip-higher, Dr. GRPO's aggregation).

Per sampled token: `rho = exp(logp - old_logp)` and `min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)`,
averaged over every masked token of the batch (a token-level mean, so a long trajectory is not
down-weighted per token). `ratio_cap` truncates rho before the objective: without it a token whose
advantage is negative and whose ratio has drifted far up (an older adapter sampled it) has an
unbounded term. The optional KL to the reference uses the k3 estimator
`exp(ref - logp) - (ref - logp) - 1`, which is >= 0 and unbiased. Everything is computed in fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from art_proxy.local.sampling import top_k_top_p_filtered
from art_proxy.wire import MIN_LOGPROB


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


@dataclass(frozen=True)
class SamplingTransforms:
    """Per position, what the sampler did to the logits before drawing that position's token
    (None: nothing, for every position): divide by a temperature, keep the top-k, keep the top-p."""

    temperatures_B_T: torch.Tensor | None = None
    top_k_B_T: torch.Tensor | None = None  # 0 = off
    top_p_B_T: torch.Tensor | None = None  # 1 = off

    def to(self, device: torch.device) -> SamplingTransforms:
        return self._each(lambda tensor: tensor.to(device))

    def rows(self, rows: slice | torch.Tensor, length: int) -> SamplingTransforms:
        return self._each(lambda tensor: tensor[rows, :length])

    def _each(self, change: Callable[[torch.Tensor], torch.Tensor]) -> SamplingTransforms:
        def changed(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else change(tensor)

        return SamplingTransforms(
            changed(self.temperatures_B_T), changed(self.top_k_B_T), changed(self.top_p_B_T)
        )


NO_TRANSFORMS = SamplingTransforms()


def token_logprobs(
    logits_B_T_V: torch.Tensor,
    tokens_B_T: torch.Tensor,
    transforms: SamplingTransforms = NO_TRANSFORMS,
) -> torch.Tensor:
    """logprobs_B_T[b, t] = log p(tokens[b, t] | tokens[b, :t]); position 0 has no prediction: 0.

    Token t is scored from the distribution it was sampled from: the logits divided by its
    temperature, then what its top-k and top-p leave out removed (local-llm's sampler's own
    filter, which vLLM's matches). The only full-vocabulary tensors beyond the logits are
    log_softmax's output, the fp32 cast or the division, and a filtered copy where a filter is on;
    the gather keeps one value per position.
    """
    logits_B_Tm1_V = logits_B_T_V[:, :-1].float()
    if transforms.temperatures_B_T is not None:
        # The logits at t-1 predict token t: they take token t's temperature.
        logits_B_Tm1_V = logits_B_Tm1_V / transforms.temperatures_B_T[:, 1:].unsqueeze(-1)
    filtered = transforms.top_k_B_T is not None or transforms.top_p_B_T is not None
    if filtered:
        logits_B_Tm1_V = _filtered(logits_B_Tm1_V, transforms)
    logprobs_B_Tm1_V = torch.log_softmax(logits_B_Tm1_V, dim=-1)
    predicted_B_Tm1 = logprobs_B_Tm1_V.gather(-1, tokens_B_T[:, 1:].unsqueeze(-1)).squeeze(-1)
    if filtered:
        # vLLM writes the logprob of an id its filters left out (-inf) as MIN_LOGPROB; so does
        # the trainer for a sampled id the new weights' top-k or top-p leave out (its ratio is
        # then 0, its gradient none).
        predicted_B_Tm1 = predicted_B_Tm1.clamp(min=MIN_LOGPROB)
    return torch.nn.functional.pad(predicted_B_Tm1, (1, 0))


def _filtered(logits_B_Tm1_V: torch.Tensor, transforms: SamplingTransforms) -> torch.Tensor:
    """The logits with each position's top-k and top-p applied (only where one is on)."""
    shape = logits_B_Tm1_V.shape[:2]
    top_k_B_Tm1 = (
        torch.zeros(shape, dtype=torch.int64)
        if transforms.top_k_B_T is None
        else transforms.top_k_B_T[:, 1:]
    )
    top_p_B_Tm1 = torch.ones(shape) if transforms.top_p_B_T is None else transforms.top_p_B_T[:, 1:]
    where = ((top_k_B_Tm1 > 0) | (top_p_B_Tm1 < 1.0)).nonzero(as_tuple=True)
    filtered_N_V = top_k_top_p_filtered(
        logits_B_Tm1_V[where], top_k_B_Tm1[where], top_p_B_Tm1[where]
    )
    return logits_B_Tm1_V.index_put(where, filtered_N_V)


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
