"""Group-relative advantages: GRPO compares trajectories of one scenario with each other.

`A_i = r_i - mean(r)` within a group, divided by the population std only when asked (Dr. GRPO shows
the division biases toward groups that are nearly all right or all wrong, so it is off by default).
A group whose rewards are all equal (one member included; `art_proxy.rewards.has_signal`) carries
no signal: it is skipped and counted, never turned into zero-advantage tokens that would only dilute
the token-level mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from art_proxy.rewards import has_signal, mean_or_nan, population_std


@dataclass(frozen=True)
class Advantages:
    by_trajectory: dict[str, float]
    groups_used: int
    groups_skipped: int  # zero reward variance: no signal


def group_advantages(
    rewards_by_group: Mapping[str, Mapping[str, float]], *, scale_by_std: bool = False
) -> Advantages:
    by_trajectory: dict[str, float] = {}
    used = skipped = 0
    for rewards_G in rewards_by_group.values():
        if not has_signal(rewards_G.values()):
            skipped += 1
            continue
        used += 1
        mean = mean_or_nan(rewards_G.values())
        scale = population_std(rewards_G.values()) if scale_by_std else 1.0
        for trajectory_id, reward in rewards_G.items():
            by_trajectory[trajectory_id] = (reward - mean) / scale
    return Advantages(by_trajectory, used, skipped)
