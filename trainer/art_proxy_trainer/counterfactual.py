"""What a candidate adapter would earn on production prompts, before any user is served by it.

The proxy's shadow samples (`serve --shadow-fraction`) are extra answers drawn beside served
production calls, by the model production serves, each recorded with its sampling logprobs and
rewarded like any group (a judge ranks them). Scored by the candidate (its logprob of each sampled
token after the same prompt, as a teacher scores a call), each sample's importance weight

    w = exp(sum over its tokens of log pi_candidate - log mu)

turns their rewards into an estimate of the candidate's mean reward on the same prompts: the
self-normalised mean sum(w r) / sum(w). Weights over a whole answer vary wildly, so each is
truncated at `cap` (bias traded for variance), and the effective sample size (sum w)^2 / sum(w^2)
says how many samples the estimate is really worth: far below their count, it is a hint, not
evidence. With the candidate's weights equal to the sampler's, every w is 1 and the estimate is
the on-policy mean of the samples, its effective size their count.

Before a canary serves the candidate to anyone, the promoter asks `gate`: a candidate whose
estimate is below the samples' own mean (what the current target earned on them) by more than the
canary's `min_effect`, on at least `MIN_EFFECTIVE` effective samples, is held back. It is a screen
on a point estimate, not a decision with an error rate: it only keeps users from a candidate the
evidence already disfavours, and the canary's interval still decides whatever it lets through.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Effective samples below which the estimate is a hint, never a reason to hold a candidate back.
MIN_EFFECTIVE = 10.0


@dataclass(frozen=True)
class ScoredSample:
    reward: float
    candidate_logprobs: Sequence[float]  # log pi_candidate of each sampled token
    sampler_logprobs: Sequence[float]  # log mu of the same tokens, as recorded


@dataclass(frozen=True)
class OffPolicyEstimate:
    mean: float | None  # None: no sample
    effective_samples: float
    samples: int
    truncated: int  # weights cut at the cap

    def __str__(self) -> str:
        if self.mean is None:
            return "no shadow samples to estimate from"
        return (
            f"off-policy {self.mean:.2f} from {self.samples} shadow samples (effective "
            f"{self.effective_samples:.1f}, {self.truncated} weights truncated)"
        )


def off_policy_estimate(samples: Sequence[ScoredSample], cap: float = 10.0) -> OffPolicyEstimate:
    """The candidate's self-normalised importance-weighted mean reward over `samples`; its
    effective sample size is of the weights before truncation (truncated ones, all at the cap,
    would look evenly spread)."""
    log_weights = []
    for sample in samples:
        if len(sample.candidate_logprobs) != len(sample.sampler_logprobs):
            raise ValueError("a sample's candidate and sampler logprobs must cover the same tokens")
        log_weights.append(
            math.fsum(sample.candidate_logprobs) - math.fsum(sample.sampler_logprobs)
        )
    if not samples:
        return OffPolicyEstimate(None, 0.0, 0, 0)
    weights = [math.exp(min(w, math.log(cap))) for w in log_weights]
    truncated = sum(w > math.log(cap) for w in log_weights)
    total = math.fsum(weights)
    mean = math.fsum(w * s.reward for w, s in zip(weights, samples, strict=True)) / total
    # (sum w)^2 / sum w^2 from the untruncated log-weights, scaled by their largest.
    top = max(log_weights)
    raw = [math.exp(w - top) for w in log_weights]
    effective = math.fsum(raw) ** 2 / math.fsum(w * w for w in raw)
    return OffPolicyEstimate(mean, effective, len(samples), truncated)


def gate(estimate: OffPolicyEstimate, on_policy: float, min_effect: float) -> tuple[bool, str]:
    """Whether a canary may start for a candidate estimated at `estimate` on samples whose own
    mean reward is `on_policy`, and the evidence line."""
    if estimate.mean is None:
        return True, str(estimate)
    line = f"{estimate} vs {on_policy:.2f} on-policy"
    if estimate.effective_samples < MIN_EFFECTIVE:
        return True, f"{line}: too few effective samples to hold it back"
    if estimate.truncated * 2 > estimate.samples:
        return True, f"{line}: too many weights truncated to hold it back"
    if estimate.mean < on_policy - min_effect:
        return False, f"{line}: below by more than {min_effect:g}"
    return True, line
