"""The token-level clipped GRPO objective, corrected for data the trainer's weights did not sample.

Three policies meet here: mu, the behaviour policy that sampled each token (its logprob recorded by
the proxy: an older adapter for production traffic, other numerics when vLLM serves bf16); pi_prox,
the proximal policy, the trainer's weights at the step (free: one optimiser step per batch, so they
are the current weights with the gradient stopped); and pi_theta, the weights being optimised.

- `tis` and `mis` (decoupled PPO, AReaL; the rollout corrections of verl, TRL and slime): the clip
  acts on `rho = pi_theta / pi_prox`, a trust region around the weights the step starts from, and mu
  enters only through the importance weight `w = pi_prox / mu`, truncated at `is_cap` (`tis`) or
  zero beyond `[1/is_cap, is_cap]` (`mis`). Every token keeps a gradient however far the policy has
  moved since mu sampled it. With one optimiser step per batch rho is 1, so `tis` gives CISPO's
  gradient too (a clipped, stop-gradient weight on every token's logprob).
- `ppo`: the original coupled objective, clipping `rho = pi_theta / mu` (truncated at `ratio_cap`):
  exact on fresh data at equal numerics, but on stale data the clip is centred on mu, and a token the
  policy has moved past the clip range in its advantage's direction gives no gradient, ever.

`min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)` is averaged over every trained token of the batch
(DAPO's token-level mean, so a long trajectory is not down-weighted per token). The optional KL to
the reference is the k3 estimator `exp(ref - logp) - (ref - logp) - 1`, weighted by the same
importance weight (its samples come from mu, not pi_theta). Everything is computed in fp32.

A warm start's step (`sft_loss`) is supervised instead: the mean negative log-likelihood of the
demonstrated tokens, at the unfiltered distribution (temperature 1, nothing cut), which is what
sampling at temperature 1 will then draw from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal

import torch

Objective = Literal["tis", "mis", "ppo"]
# e^20 ~ 5e8: far past any cap, short of float32's overflow in the weight's square.
MAX_LOG_WEIGHT = 20.0


@dataclass(frozen=True)
class LossMetrics:
    """Token means over the batch's trained tokens (`tokens` of them)."""

    clip_fraction: float  # tokens whose ratio term has no gradient (the clip won, or the cap acted)
    mean_ratio: float  # trainer over sampler before any cap: pi_prox/mu (ppo: pi_theta/mu)
    kl: float  # k3 to the reference; 0 without reference logprobs
    tokens: int
    entropy: float = 0.0  # of the distribution each token was drawn from, at the trainer's weights
    mismatch: float = 0.0  # |log pi_prox - log mu|: trainer against sampler
    mismatch_kl: float = 0.0  # k3 estimate of KL(mu || pi_prox) from mu's samples
    is_weight_sq: float = 0.0  # mean squared importance weight (with mean_ratio: their spread)
    is_capped: float = 0.0  # tokens whose weight was truncated (tis), masked (mis) or capped (ppo)
    # |log pi_theta - log pi_prox|: how far the batch's updates have moved the weights so far (0
    # in a batch's first update, where they are the proximal policy; and under ppo)
    update_drift: float = 0.0
    # The importance weight as the loss applies it: pi_prox/mu truncated at the cap (tis), 0
    # where masked (mis), 1 (ppo, whose ratio carries the correction). Beside mean_ratio, what
    # the correction changed.
    is_weight: float = 1.0

    @property
    def is_weight_std(self) -> float:
        return math.sqrt(max(self.is_weight_sq - self.mean_ratio**2, 0.0))

    def named(self, *, kl: bool) -> dict[str, float]:
        """The step's metrics by name; `kl` only where it is part of the loss (--kl-coef)."""
        metrics = {
            "clip_fraction": self.clip_fraction,
            "update_drift": self.update_drift,
            "mean_ratio": self.mean_ratio,
            "entropy": self.entropy,
            "mismatch": self.mismatch,
            "mismatch_kl": self.mismatch_kl,
            "is_weight_std": self.is_weight_std,
            "is_capped": self.is_capped,
            "is_weight": self.is_weight,
        }
        if kl:
            metrics["kl"] = self.kl
        return metrics

    def means(self) -> list[float]:
        """The token means, in field order (everything but `tokens`)."""
        return [getattr(self, f.name) for f in fields(self) if f.name != "tokens"]

    @classmethod
    def from_means(cls, means: list[float], tokens: int) -> LossMetrics:
        names = [f.name for f in fields(cls) if f.name != "tokens"]
        return cls(tokens=tokens, **dict(zip(names, means, strict=True)))

    @classmethod
    def averaged(cls, updates: Sequence[LossMetrics]) -> LossMetrics:
        """The token means over several updates of one batch (each weighted by its tokens: a
        later update may have left out a row that ran out of memory)."""
        tokens = sum(update.tokens for update in updates)
        share = [update.tokens / tokens if tokens else 1 / len(updates) for update in updates]
        means = [
            math.fsum(weight * mean for weight, mean in zip(share, column, strict=True))
            for column in zip(*(update.means() for update in updates), strict=True)
        ]
        return cls.from_means(means, round(tokens / len(updates)))


@dataclass(frozen=True)
class LossResult:
    loss: torch.Tensor  # scalar, to minimise
    metrics: LossMetrics


@dataclass(frozen=True)
class Correction:
    """How recorded logprobs enter the objective (see the module docstring)."""

    objective: Objective = "tis"
    is_cap: float = 2.0  # tis/mis: the importance weight's bound
    ratio_cap: float = 3.0  # ppo: truncate pi_theta/mu here before clipping; 0 = off


def grpo_loss(
    logprobs_B_T: torch.Tensor,
    old_logprobs_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    correction: Correction = Correction(),
    kl_coef: float = 0.0,
    ref_logprobs_B_T: torch.Tensor | None = None,
    entropy_B_T: torch.Tensor | None = None,
    prox_logprobs_B_T: torch.Tensor | None = None,
) -> LossResult:
    """The loss to minimise (minus the objective, plus kl_coef * KL). `advantages_B` is each
    row's advantage, or each token's (B x T: a teacher's term added); `old_logprobs_B_T` are the
    sampler's (mu); `prox_logprobs_B_T` the proximal policy's, the trainer's weights when the
    batch's first update began (None: the weights now, the batch's only update);
    `entropy_B_T` is measured, never trained."""
    mask_B_T = mask_B_T.float()
    trained_B_T = mask_B_T > 0
    tokens = mask_B_T.sum().clamp(min=1.0)
    logprobs_B_T = logprobs_B_T.float()
    prox_B_T = logprobs_B_T.detach() if prox_logprobs_B_T is None else prox_logprobs_B_T.float()
    # Context and padding positions may hold anything: keep them out of exp, where an overflow
    # would turn into inf * 0 = nan.
    behaviour_log_ratio_B_T = torch.where(trained_B_T, prox_B_T - old_logprobs_B_T.float(), 0.0)
    # pi_prox / mu; bounded so that a token the sampler nearly never drew cannot overflow.
    behaviour_ratio_B_T = torch.exp(behaviour_log_ratio_B_T.clamp(max=MAX_LOG_WEIGHT))
    # A row's advantage for each of its tokens, or each token's own (on-policy distillation).
    advantages_B_1 = (
        advantages_B.float() if advantages_B.dim() == 2 else advantages_B.float()[:, None]
    )

    if correction.objective == "ppo":
        ratio_B_T = torch.exp(
            torch.where(trained_B_T, logprobs_B_T - old_logprobs_B_T.float(), 0.0)
        )
        measured_ratio_B_T = ratio_B_T.detach()  # before the cap
        capped_B_T = torch.zeros_like(trained_B_T)
        if correction.ratio_cap > 0:
            capped_B_T = ratio_B_T.detach() > correction.ratio_cap
            ratio_B_T = ratio_B_T.clamp(max=correction.ratio_cap)
        weight_B_T = torch.ones_like(ratio_B_T)
    else:
        measured_ratio_B_T = behaviour_ratio_B_T
        ratio_B_T = torch.exp(torch.where(trained_B_T, logprobs_B_T - prox_B_T, 0.0))
        cap = correction.is_cap
        if correction.objective == "tis":
            capped_B_T = behaviour_ratio_B_T > cap
            weight_B_T = behaviour_ratio_B_T.clamp(max=cap)
        else:
            capped_B_T = (behaviour_ratio_B_T > cap) | (behaviour_ratio_B_T < 1.0 / cap)
            weight_B_T = torch.where(capped_B_T, 0.0, behaviour_ratio_B_T)
    unclipped_B_T = ratio_B_T * advantages_B_1
    clipped_B_T = ratio_B_T.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages_B_1
    objective_B_T = torch.minimum(unclipped_B_T, clipped_B_T) * weight_B_T
    loss = -(objective_B_T * mask_B_T).sum() / tokens

    kl = torch.zeros((), dtype=torch.float32, device=logprobs_B_T.device)
    if ref_logprobs_B_T is not None:
        ref_log_ratio_B_T = torch.where(trained_B_T, ref_logprobs_B_T.float() - logprobs_B_T, 0.0)
        k3_B_T = torch.exp(ref_log_ratio_B_T) - ref_log_ratio_B_T - 1.0
        kl = (k3_B_T * weight_B_T * mask_B_T).sum() / tokens
        loss = loss + kl_coef * kl

    with torch.no_grad():

        def mean(values_B_T: torch.Tensor) -> float:
            return float((values_B_T.float() * mask_B_T).sum() / tokens)

        # A truncated weight (tis) still carries its token's gradient; a capped ratio (ppo) or a
        # masked weight (mis) does not.
        no_gradient_B_T = clipped_B_T < unclipped_B_T
        if correction.objective != "tis":
            no_gradient_B_T = no_gradient_B_T | capped_B_T
        metrics = LossMetrics(
            clip_fraction=mean(no_gradient_B_T),
            mean_ratio=mean(measured_ratio_B_T),
            kl=float(kl),
            tokens=int(mask_B_T.sum()),
            entropy=0.0 if entropy_B_T is None else mean(entropy_B_T),
            mismatch=mean(behaviour_log_ratio_B_T.abs()),
            mismatch_kl=mean(behaviour_ratio_B_T - 1.0 - behaviour_log_ratio_B_T),
            is_weight_sq=mean(measured_ratio_B_T.square()),
            is_capped=mean(capped_B_T),
            update_drift=mean(
                torch.where(trained_B_T, logprobs_B_T.detach() - prox_B_T, 0.0).abs()
            ),
            is_weight=mean(weight_B_T),
        )
    return LossResult(loss, metrics)


def sft_loss(
    logprobs_B_T: torch.Tensor, mask_B_T: torch.Tensor, entropy_B_T: torch.Tensor | None = None
) -> LossResult:
    """The mean negative log-likelihood of the trained (demonstrated) tokens; no sampler, so no
    ratio, clip or importance weight (their metrics are those of a policy equal to itself)."""
    mask_B_T = mask_B_T.float()
    trained_B_T = mask_B_T > 0
    tokens = mask_B_T.sum().clamp(min=1.0)
    # Context and padding positions may hold anything (an -inf would make inf * 0 = nan).
    logprobs_B_T = torch.where(trained_B_T, logprobs_B_T.float(), 0.0)
    loss = -(logprobs_B_T * mask_B_T).sum() / tokens
    with torch.no_grad():
        entropy = (
            0.0 if entropy_B_T is None else float((entropy_B_T.float() * mask_B_T).sum() / tokens)
        )
        metrics = LossMetrics(
            clip_fraction=0.0,
            mean_ratio=1.0,
            kl=0.0,
            tokens=int(mask_B_T.sum()),
            entropy=entropy,
            is_weight_sq=1.0,
        )
    return LossResult(loss, metrics)
