"""Group-relative advantages: GRPO compares trajectories of one scenario with each other.

`A_i = r_i - mean(r)` within a group, divided by the population std only when asked (Dr. GRPO shows
the division biases toward groups that are nearly all right or all wrong, so it is off by default).
A group whose rewards are all equal (one member included; `art_proxy.rewards.has_signal`) carries
no signal: it is skipped and counted, never turned into zero-advantage tokens that would only dilute
the token-level mean.

A guided retry (its group's `baseline_group` set) is pooled with the unguided group it retried:
the policy being trained is the unguided one, so its baseline is the unguided rollouts' rewards
and the hinted ones' together. A retry the hint rescued entirely then carries signal (+/- against
the failures) instead of being a second group without spread.

On-policy distillation adds a per-token term (`token_advantages`): where a teacher scored a sampled
token, `teacher_weight * (log p_teacher(y_t) - log mu(y_t))`, mu the sampler's recorded logprob,
the single-sample estimate of minus the reverse KL from the teacher at that token. A group without
reward spread still trains on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from art_proxy.records import TrainableGroup
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


def pooled(groups: Sequence[TrainableGroup]) -> dict[str, list[TrainableGroup]]:
    """The groups by the group whose baseline they share: a guided retry with its unguided
    group (when that is among `groups`), every other group on its own."""
    ids = {group.group_id for group in groups}
    pools: dict[str, list[TrainableGroup]] = {}
    for group in groups:
        baseline = group.baseline_group
        pool = baseline if baseline is not None and baseline in ids else group.group_id
        pools.setdefault(pool, []).append(group)
    return pools


def pooled_rewards(members: Sequence[TrainableGroup]) -> dict[str, float]:
    return {t: r for group in members for t, r in group.rewards.items()}


def token_advantages(
    advantages_B: torch.Tensor,
    teacher_logprobs_B_T: torch.Tensor,
    old_logprobs_B_T: torch.Tensor,
    *,
    teacher_weight: float,
    group_weight: float = 1.0,
) -> torch.Tensor:
    """Each token's advantage: its row's group advantage times `group_weight`, plus where the
    teacher scored the token (not NaN) `teacher_weight` times the teacher's logprob minus the
    sampler's (see the module docstring)."""
    teacher_term_B_T = torch.where(
        teacher_logprobs_B_T.isnan(), 0.0, teacher_logprobs_B_T - old_logprobs_B_T
    )
    return group_weight * advantages_B.float()[:, None] + teacher_weight * teacher_term_B_T
