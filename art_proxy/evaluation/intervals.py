"""95% intervals for what an evaluation reports: a success rate, a mean reward, a paired difference.

A 0/1 reward (success) gets Wilson's score interval, which stays inside [0, 1] and keeps its
coverage at 0 or n successes where the normal approximation collapses to a point. Any other
reward gets a percentile bootstrap over rollouts. A difference between two arms is paired: both
ran the same scenarios, so the unit resampled is the scenario (its mean reward under each arm),
which removes the scenarios' own spread from the comparison. The bootstrap draws from a seeded
generator: the same rewards give the same interval. A bootstrap cannot see spread it did not
sample: where every scenario's difference is the same (both arms failing every rollout, say), its
interval is a point, which 16 rollouts an arm cannot support; for 0/1 rewards the difference then
takes Newcombe's hybrid score interval from the two arms' Wilson intervals (Newcombe 1998, method
10), which keeps its coverage at 0 or n successes as Wilson's does.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence

from art_proxy.records.evaluations import Estimate

# The normal quantile at 0.975: a two-sided 95% interval.
Z95 = 1.959963984540054
# Resamples of a bootstrap: the percentiles of 2,000 move by well under 0.01 between seeds on the
# rewards of a few hundred rollouts, and it costs milliseconds.
BOOTSTRAP_RESAMPLES = 2000


NOTHING = Estimate(mean=None, low=None, high=None, n=0, method="none")


def is_binary(values: Sequence[float]) -> bool:
    return all(value in (0.0, 1.0) for value in values)


def wilson(successes: int, n: int, z: float = Z95) -> Estimate:
    """The Wilson score interval of `successes` in `n` trials."""
    if n == 0:
        return NOTHING
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return Estimate(
        # Bounded by [0, 1] and, against rounding at 0 or n successes, holding p.
        mean=p,
        low=min(p, max(0.0, centre - half)),
        high=max(p, min(1.0, centre + half)),
        n=n,
        method="wilson",
    )


def bootstrap_mean(values: Sequence[float], seed: int = 0) -> Estimate:
    """The mean of `values` with a percentile bootstrap interval."""
    if not values:
        return NOTHING
    draw = random.Random(seed)
    n = len(values)
    means = sorted(math.fsum(draw.choices(values, k=n)) / n for _ in range(BOOTSTRAP_RESAMPLES))
    return Estimate(
        mean=statistics.fmean(values),
        low=_percentile(means, 0.025),
        high=_percentile(means, 0.975),
        n=n,
        method="bootstrap",
    )


def mean_interval(values: Sequence[float], seed: int = 0) -> Estimate:
    """Wilson's interval for 0/1 rewards, else the bootstrap's."""
    if values and is_binary(values):
        return wilson(int(sum(values)), len(values))
    return bootstrap_mean(values, seed)


def paired_difference(
    arm: Mapping[str, Sequence[float]], reference: Mapping[str, Sequence[float]], seed: int = 0
) -> Estimate:
    """The mean over scenarios of (arm's mean reward - the reference's) on the scenarios both
    have rewards for, with a bootstrap interval that resamples scenarios."""
    shared = sorted(key for key in arm if arm[key] and reference.get(key))
    differences = [statistics.fmean(arm[key]) - statistics.fmean(reference[key]) for key in shared]
    ours = [reward for key in shared for reward in arm[key]]
    theirs = [reward for key in shared for reward in reference[key]]
    if len(set(differences)) == 1 and is_binary(ours) and is_binary(theirs):
        arms = wilson(int(sum(ours)), len(ours)), wilson(int(sum(theirs)), len(theirs))
        return newcombe(*arms, scenarios=len(shared))
    return bootstrap_mean(differences, seed)


def newcombe(arm: Estimate, reference: Estimate, *, scenarios: int) -> Estimate:
    """The difference of two success rates with Newcombe's hybrid score interval, from each
    one's Wilson interval."""
    assert arm.mean is not None and reference.mean is not None  # both from rollouts
    assert arm.low is not None and arm.high is not None
    assert reference.low is not None and reference.high is not None
    difference = arm.mean - reference.mean
    below = math.hypot(arm.mean - arm.low, reference.high - reference.mean)
    above = math.hypot(arm.high - arm.mean, reference.mean - reference.low)
    return Estimate(
        mean=difference,
        low=difference - below,
        high=difference + above,
        n=scenarios,
        method="newcombe",
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, interpolated (NaN when empty)."""
    return _percentile(sorted(values), q) if values else math.nan


def _percentile(ordered: Sequence[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
