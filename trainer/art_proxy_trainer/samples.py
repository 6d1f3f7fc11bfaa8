"""From a step's scored groups to the samples it trains on: too-stale groups left out, groups
without signal left out, advantages within each group (a guided retry pooled with its unguided
group: advantages.pooled)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from art_proxy.records import CallRecord, GroupOutcome, TrainableGroup
from art_proxy.rewards import has_signal
from art_proxy_trainer.advantages import group_advantages, pooled, pooled_rewards
from art_proxy_trainer.batch import TrajectorySample
from art_proxy_trainer.swap import step_of_run


def trajectory_samples(
    groups: Sequence[TrainableGroup],
    calls: Mapping[str, list[CallRecord]],
    outcomes: dict[str, GroupOutcome],
    metrics: dict[str, float],
    *,
    policy_step: int,
    alias: str,
    run_tag: str,
    staleness_bound: int,
    scale_by_std: bool,
) -> list[TrajectorySample]:
    """The trajectories a step trains on, each with its advantage. Each group's outcome is set
    in `outcomes`: `stale` (sampled more than `staleness_bound` steps behind `policy_step`),
    `zero_variance` (its pool's rewards carry no signal) or `trained`; the trained groups'
    staleness goes into `metrics`."""
    # Age is counted from the weights trained now, not from the step number: after steps
    # abandoned for want of signal, the base model's new samples are still on-policy. An
    # adapter of another run is on none of this run's steps: past any bound.
    behind: dict[str, float] = {}
    current: list[TrainableGroup] = []
    for group in groups:
        served = [c.model for t in group.rewards for c in calls.get(t, [])]
        steps = [step_of_run(model, alias, run_tag) for model in served]
        behind[group.group_id] = max(
            (math.inf if step is None else policy_step - step for step in steps),
            default=0,
        )
        bound = staleness_bound
        if bound and behind[group.group_id] > bound:
            outcomes[group.group_id] = "stale"
        else:
            current.append(group)
    # A guided retry shares its unguided group's baseline (advantages.pooled).
    fresh: dict[str, dict[str, float]] = {}
    staleness: list[float] = []
    other_runs = 0
    for pool, members in pooled(current).items():
        rewards = pooled_rewards(members)
        if not has_signal(rewards.values()):
            outcomes |= {group.group_id: "zero_variance" for group in members}
            continue
        fresh[pool] = rewards
        outcomes |= {group.group_id: "trained" for group in members}
        ages = [behind[group.group_id] for group in members]
        staleness += [float(max(age, 0)) for age in ages if age != math.inf]
        other_runs += sum(age == math.inf for age in ages)
    if other_runs:
        metrics["groups_of_other_runs"] = float(other_runs)
    if staleness:
        metrics["staleness_mean"] = math.fsum(staleness) / len(staleness)
        metrics["staleness_max"] = max(staleness)
    advantages = group_advantages(fresh, scale_by_std=scale_by_std).by_trajectory
    return [
        TrajectorySample(t, calls.get(t, []), advantages[t])
        for rewards in fresh.values()
        for t in rewards
    ]
