"""Group-relative advantages: GRPO compares trajectories of one scenario with each other.

`A_i = r_i - mean(r)` within a group, divided by the population std only when asked (Dr. GRPO shows
the division biases toward groups that are nearly all right or all wrong, so it is off by default).
A group whose rewards are all equal (one member included) carries no signal: it is skipped and
counted, never turned into zero-advantage tokens that would only dilute the token-level mean.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from art_proxy.records import Judgment

# Rewards closer than this are equal: judges print scores with a few decimals at most.
ZERO_VARIANCE_STD = 1e-6


@dataclass(frozen=True)
class Advantages:
    by_trajectory: dict[str, float]
    groups_used: int
    groups_skipped: int  # zero reward variance: no signal


def rewards_by_group(judgments: Iterable[Judgment]) -> dict[str, dict[str, float]]:
    """group id -> trajectory id -> reward, from the judgments that scored their group."""
    return {
        judgment.group_id: {score.trajectory_id: score.reward for score in judgment.scores}
        for judgment in judgments
        if judgment.status == "scored" and judgment.scores
    }


def group_advantages(
    rewards_by_group: Mapping[str, Mapping[str, float]], *, scale_by_std: bool = False
) -> Advantages:
    by_trajectory: dict[str, float] = {}
    used = skipped = 0
    for rewards in rewards_by_group.values():
        values = list(rewards.values())
        mean = math.fsum(values) / len(values) if values else 0.0
        std = math.sqrt(math.fsum((r - mean) ** 2 for r in values) / len(values)) if values else 0.0
        if std < ZERO_VARIANCE_STD:
            skipped += 1
            continue
        used += 1
        for trajectory_id, reward in rewards.items():
            by_trajectory[trajectory_id] = (reward - mean) / std if scale_by_std else reward - mean
    return Advantages(by_trajectory, used, skipped)
