"""The off-policy estimate of a candidate's reward from shadow samples (counterfactual.py)."""

from __future__ import annotations

import math

import pytest

from art_proxy_trainer.counterfactual import (
    OffPolicyEstimate,
    ScoredSample,
    gate,
    off_policy_estimate,
)


def test_at_the_samplers_own_weights_the_estimate_is_the_on_policy_mean() -> None:
    samples = [
        ScoredSample(reward, [-0.5, -1.25, -0.1], [-0.5, -1.25, -0.1])
        for reward in (1.0, 0.0, 0.5, 1.0, 0.25)
    ]
    estimate = off_policy_estimate(samples)
    assert estimate.mean == pytest.approx(2.75 / 5)
    assert estimate.effective_samples == pytest.approx(5) and estimate.truncated == 0


def test_a_candidate_likelier_to_say_the_rewarded_answers_is_estimated_higher() -> None:
    # The candidate doubles the chance of each rewarded answer and halves the others'.
    good = ScoredSample(1.0, [math.log(0.2)], [math.log(0.1)])
    bad = ScoredSample(0.0, [math.log(0.05)], [math.log(0.1)])
    estimate = off_policy_estimate([good, bad, bad, good])
    assert estimate.mean == pytest.approx(2 * 2 / (2 * 2 + 2 * 0.5))  # 0.8, against 0.5 on-policy
    assert 2 < estimate.effective_samples < 4


def test_weights_are_truncated_at_the_cap_and_nothing_estimates_nothing() -> None:
    wild = ScoredSample(1.0, [0.0] * 20, [-1.0] * 20)  # e^20 as likely under the candidate
    plain = ScoredSample(0.0, [-1.0], [-1.0])
    estimate = off_policy_estimate([wild, plain], cap=4.0)
    assert estimate.truncated == 1 and estimate.mean == pytest.approx(4 / 5)
    assert off_policy_estimate([]).mean is None
    assert str(off_policy_estimate([])) == "no shadow samples to estimate from"
    assert (
        str(estimate)
        == "off-policy 0.80 from 2 shadow samples (effective 1.0, 1 weights truncated)"
    )
    with pytest.raises(ValueError, match="same tokens"):
        off_policy_estimate([ScoredSample(1.0, [0.0], [])])


def _estimate(mean: float | None, effective: float) -> OffPolicyEstimate:
    return OffPolicyEstimate(mean, effective, samples=40, truncated=0)


def test_the_gate_holds_back_only_a_candidate_clearly_below_on_enough_effective_samples() -> None:
    passes, said = gate(_estimate(0.40, 12.0), 0.50, min_effect=0.05)
    assert not passes
    assert said == (
        "off-policy 0.40 from 40 shadow samples (effective 12.0, 0 weights truncated) vs 0.50 "
        "on-policy: below by more than 0.05"
    )
    assert gate(_estimate(0.46, 12.0), 0.50, min_effect=0.05)[0]  # within the smallest effect
    passes, said = gate(_estimate(0.10, 3.5), 0.50, min_effect=0.05)
    assert passes and said.endswith("too few effective samples to hold it back")
    assert gate(_estimate(None, 0.0), 0.50, min_effect=0.05) == (
        True,
        "no shadow samples to estimate from",
    )


def test_weights_all_truncated_are_no_evidence_however_even_they_look() -> None:
    """Every sample e^30 likelier under the candidate: truncated, all weights are the cap and
    would look like 40 effective samples; untruncated they are what they are, and the gate does
    not hold the candidate back on them."""
    samples = [ScoredSample(float(i % 2), [0.0] * 30, [-1.0] * 30) for i in range(40)]
    estimate = off_policy_estimate(samples)
    assert estimate.truncated == 40 and estimate.effective_samples == pytest.approx(40)
    uneven = [ScoredSample(float(i % 2), [0.0] * (30 + i), [-1.0] * (30 + i)) for i in range(40)]
    estimate = off_policy_estimate(uneven)
    assert estimate.effective_samples < 3  # the longest few dominate before the cap
    wild = OffPolicyEstimate(0.1, 40.0, samples=40, truncated=40)
    passes, said = gate(wild, 0.5, min_effect=0.05)
    assert passes and said.endswith("too many weights truncated to hold it back")
