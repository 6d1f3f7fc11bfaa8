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

A decision needs `MIN_PER_ARM` scored trajectories on each arm of a stage (the asymptotics need a
few, and a variance of 0 early on would claim certainty). Then: **promote** when the whole
interval is above 0, **roll back** when it is below 0, **keep** the current target when it lies within
(-min_effect, +min_effect) (no effect worth acting on), else **hold** and look again.

A canary may widen in stages (`CanaryPolicy.fractions`, e.g. 5% then 25%: few users meet a bad
candidate at first, and a good one is decided sooner on more traffic). A stage that has served
`stage_trajectories` scored trajectories on the candidate and is still holding widens to the
next share. The evidence is kept across stages, stratified by stage: the difference is each
stage's own difference in means (the two arms of one stage served the same hours), weighted by
what the stage's counts say of its precision, n1 n0 / (n1 + n0) (Mantel-Haenszel's weights: a 5%
stage of 600 trajectories, 30 of them on the candidate, weighs as 28 and not as 600), and its
variance the stages' variances so weighted. Pooling the arms across stages instead would weigh
the candidate's arm towards the later, wider stages' hours, and a drift of the traffic between
them would read as an effect. With one stage this is the difference in means above, exactly.
The sequence is made tightest for the first, smallest share. Its boundary runs on the count of
trajectories, and a trajectory of a small share carries less information on the difference than
one of a wide share: tuned for the widest, 4,000 simulated equal canaries (5% -> 25% -> 50%,
drifting traffic of varied users) moved 5.9% of the time; tuned for the smallest, 1.8%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
        """The sample variance (n - 1) with two pseudo-rewards added, 0 and 1 (rewards lie in
        [0, 1]): ten successes out of ten are not certainty. Without them a small arm that
        happens to be all 1s (a 5% share, a base rate of 0.9) has a variance of 0, the interval
        rests on the other arm alone, and equal arms are moved far above alpha (26% at 5%,
        rate 0.9)."""
        count = self.count + 2
        total = self.total + 1
        return ((self.squares + 1 - total.square() / count) / (count - 1)).clamp(min=0)


@dataclass(frozen=True)
class CanaryPolicy:
    """How a canary runs: its stages' shares of new trajectories (increasing, each below 1), its
    error rate and smallest effect worth acting on, when a stage widens, and how many shadow
    samples the off-policy gate reweighs before the first (0: no gate)."""

    fractions: tuple[float, ...]
    alpha: float
    min_effect: float
    stage_trajectories: int = 30
    gate_samples: int = 0
    max_trajectories: int = 6000  # scored, both arms: undecided by then, the target is kept

    def __post_init__(self) -> None:
        shares = self.fractions
        if not shares or any(not 0 < f < 1 for f in shares) or list(shares) != sorted(set(shares)):
            raise ValueError(f"a canary's shares must increase within (0, 1), not {shares}")

    def stage(self, fraction: float) -> int:
        """The stage serving `fraction` (the nearest: a share set by hand may be none)."""
        return min(range(len(self.fractions)), key=lambda i: abs(self.fractions[i] - fraction))

    def widens(self, fraction: float, scored_on_candidate: int) -> float | None:
        """The next stage's share, once a holding stage has served its trajectories; None:
        look again at this one."""
        stage = self.stage(fraction)
        if stage + 1 == len(self.fractions) or scored_on_candidate < self.stage_trajectories:
            return None
        return self.fractions[stage + 1]


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


@dataclass(frozen=True)
class Stage:
    """The evidence of one share: the trajectories drawn while the candidate served `fraction`."""

    fraction: float
    candidate: ArmRewards
    current: ArmRewards


def interval(stages: Sequence[Stage], *, alpha: float, min_effect: float) -> Interval:
    """The (1 - alpha) anytime-valid interval on the difference in mean reward, stratified by
    stage (a stage counts once each of its arms has `MIN_PER_ARM` scored)."""
    zero = torch.zeros_like(stages[0].candidate.count)
    t, weights, weighted, spread = zero, zero, zero, zero
    for stage in stages:
        candidate, current = stage.candidate, stage.current
        counted = _counted(stage)
        t = t + torch.where(counted, candidate.count + current.count, 0)
        # The stage's precision from its counts alone (not its rewards): n1 n0 / (n1 + n0).
        weight = torch.where(
            counted,
            candidate.count * current.count / (candidate.count + current.count).clamp(min=1),
            0,
        )
        weights = weights + weight
        weighted = weighted + weight * (candidate.mean - current.mean)
        variance = candidate.variance / candidate.count.clamp(min=1) + (
            current.variance / current.count.clamp(min=1)
        )
        spread = spread + weight * weight * variance
    t = t.clamp(min=1)
    weights = weights.clamp(min=1e-12)
    difference = weighted / weights
    # sigma_hat^2 / t is the variance of the stratified difference.
    variance = t * spread / (weights * weights)
    # Tightest for the smallest share (a share of 0 or 1, set by hand, has no design).
    fraction = min(max(stages[0].fraction, 1e-3), 1 - 1e-3)
    rho2 = _rho_squared(design_trajectories(fraction, min_effect, alpha), alpha)
    radius = (
        variance * 2 * (t * rho2 + 1) / (t * t * rho2) * torch.log(torch.sqrt(t * rho2 + 1) / alpha)
    ).sqrt()
    return Interval(difference, difference - radius, difference + radius)


def verdict(
    stages: Sequence[Stage], *, alpha: float, min_effect: float
) -> tuple[torch.Tensor, Interval]:
    """Each canary's verdict, as an index into VERDICTS, with its interval."""
    bounds = interval(stages, alpha=alpha, min_effect=min_effect)
    on_candidate = on_current = torch.zeros_like(bounds.difference)
    for stage in stages:
        counted = _counted(stage)
        on_candidate = on_candidate + torch.where(counted, stage.candidate.count, 0)
        on_current = on_current + torch.where(counted, stage.current.count, 0)
    ready = (on_candidate >= MIN_PER_ARM) & (on_current >= MIN_PER_ARM)
    decided = torch.zeros_like(bounds.difference, dtype=torch.long)
    decided = torch.where(ready & (bounds.low > 0), 1, decided)
    decided = torch.where(ready & (bounds.high < 0), 2, decided)
    negligible = (bounds.low > -min_effect) & (bounds.high < min_effect)
    decided = torch.where(ready & (decided == 0) & negligible, 3, decided)
    return decided, bounds


def _counted(stage: Stage) -> torch.Tensor:
    """Whether a stage's evidence counts yet: `MIN_PER_ARM` scored on each of its arms (a
    stage's variance from one or two trajectories an arm would claim certainty)."""
    return (stage.candidate.count >= MIN_PER_ARM) & (stage.current.count >= MIN_PER_ARM)


def _rho_squared(design: float, alpha: float) -> float:
    """The mixture's spread that makes the sequence tightest at `design` trajectories (the
    paper's Eq. 13)."""
    log_term = -2 * math.log(alpha)
    return (log_term + math.log(log_term + 1)) / design


def _normal_quantile(p: float) -> float:
    return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))
