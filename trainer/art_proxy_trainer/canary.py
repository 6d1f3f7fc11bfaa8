"""A canary's decision: is the candidate better than the current target, worse, or neither, with
an error rate that holds however often the evidence is looked at.

Production traffic is split between the two at random (each trajectory's arm drawn once: a share
`fraction` to the candidate), so the difference of their mean rewards is the candidate's effect on
the same traffic. After every scored trajectory the promoter asks again, and a fixed-sample test
asked that often would err far above its alpha. An *anytime-valid* confidence sequence does not:
the chance that it ever excludes the true difference, at any of the looks, is at most alpha.

The sequence is the asymptotic confidence sequence of Waudby-Smith, Arnold, Wu, Howard and Ramdas
("Time-uniform central limit theory and asymptotic confidence sequences", Annals of Statistics
2024, Theorem 2.2, the Gaussian-mixture boundary), on the difference in means, whose per-trajectory
variance under randomization with share f is sigma_1^2 / f + sigma_0^2 / (1 - f) (their Section
3's randomized experiments; Eppo's sequential analysis is built on the same sequence). At t scored
trajectories the interval is

    difference +/- sigma_hat * sqrt(2 (t rho^2 + 1) / (t^2 rho^2) * log(sqrt(t rho^2 + 1) / alpha))

with rho chosen so the sequence is tightest where a difference of `min_effect` becomes detectable.
No library fits: confseq (the reference implementation of these sequences) ships no wheel and
needs a C++ and Boost build; savvi (anytime-valid linear models) requires cvxpy for a module this
does not use and updates one observation at a time in Python, which the 10,000-run check of the
error rate cannot afford. The arithmetic is these few lines, in torch so that one call decides
one canary or 10,000 simulated ones.

A decision needs `MIN_PER_ARM` scored trajectories on each arm (the asymptotics need a few, and a
variance of 0 early on would claim certainty). Then: **promote** when the whole interval is above
0, **roll back** when it is below 0, **keep** the current target when it lies within
(-min_effect, +min_effect) (no effect worth acting on), else **hold** and look again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from art_proxy.records import CanaryVerdict

VERDICTS: tuple[CanaryVerdict, ...] = ("hold", "promote", "rollback", "keep")

MIN_PER_ARM = 10


@dataclass(frozen=True)
class ArmRewards:
    """One arm's scored trajectories: their count, sum and sum of squares (tensors of one shape:
    one canary, or many simulated at once)."""

    count: torch.Tensor
    total: torch.Tensor
    squares: torch.Tensor

    @classmethod
    def of(cls, rewards: list[float]) -> ArmRewards:
        values = torch.tensor(rewards, dtype=torch.float64)
        return cls(
            torch.tensor(float(len(rewards)), dtype=torch.float64),
            values.sum(),
            values.square().sum(),
        )

    @property
    def mean(self) -> torch.Tensor:
        return self.total / self.count.clamp(min=1)

    @property
    def variance(self) -> torch.Tensor:
        """The sample variance (n - 1); 0 below two."""
        count = self.count.clamp(min=2)
        return ((self.squares - self.total.square() / count) / (count - 1)).clamp(min=0)


@dataclass(frozen=True)
class Interval:
    difference: torch.Tensor  # candidate's mean minus the current target's
    low: torch.Tensor
    high: torch.Tensor


def design_trajectories(fraction: float, min_effect: float, alpha: float) -> float:
    """The scored trajectories at which a fixed-sample z-test at `alpha` would just detect a
    difference of `min_effect` between rewards of variance 1/4 (the most a reward in [0, 1] has):
    where the sequence is made tightest."""
    variance = 0.25 / fraction + 0.25 / (1 - fraction)
    z = _normal_quantile(1 - alpha / 2)
    return max(z * z * variance / (min_effect * min_effect), 1.0)


def interval(
    candidate: ArmRewards, current: ArmRewards, *, fraction: float, alpha: float, min_effect: float
) -> Interval:
    """The (1 - alpha) anytime-valid interval on the difference in mean reward."""
    t = candidate.count + current.count
    # sigma_hat^2 / t is the variance of the difference in means.
    variance = t * (
        candidate.variance / candidate.count.clamp(min=1)
        + current.variance / current.count.clamp(min=1)
    )
    rho2 = _rho_squared(design_trajectories(fraction, min_effect, alpha), alpha)
    t = t.clamp(min=1)
    radius = (
        variance * 2 * (t * rho2 + 1) / (t * t * rho2) * torch.log(torch.sqrt(t * rho2 + 1) / alpha)
    ).sqrt()
    difference = candidate.mean - current.mean
    return Interval(difference, difference - radius, difference + radius)


def verdict(
    candidate: ArmRewards, current: ArmRewards, *, fraction: float, alpha: float, min_effect: float
) -> tuple[torch.Tensor, Interval]:
    """Each canary's verdict, as an index into VERDICTS, with its interval."""
    bounds = interval(candidate, current, fraction=fraction, alpha=alpha, min_effect=min_effect)
    ready = (candidate.count >= MIN_PER_ARM) & (current.count >= MIN_PER_ARM)
    decided = torch.zeros_like(bounds.difference, dtype=torch.long)
    decided = torch.where(ready & (bounds.low > 0), 1, decided)
    decided = torch.where(ready & (bounds.high < 0), 2, decided)
    negligible = (bounds.low > -min_effect) & (bounds.high < min_effect)
    decided = torch.where(ready & (decided == 0) & negligible, 3, decided)
    return decided, bounds


def _rho_squared(design: float, alpha: float) -> float:
    """The mixture's spread that makes the sequence tightest at `design` trajectories (the
    paper's Eq. 13)."""
    log_term = -2 * math.log(alpha)
    return (log_term + math.log(log_term + 1)) / design


def _normal_quantile(p: float) -> float:
    return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))
