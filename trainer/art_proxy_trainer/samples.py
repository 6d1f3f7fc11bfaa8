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
    applied_steps: Sequence[int],
    alias: str,
    run_tag: str,
    staleness_bound: int,
    scale_by_std: bool,
    keep_without_signal: bool = False,
) -> list[TrajectorySample]:
    """The trajectories a step trains on, each with its advantage. Each group's outcome is set
    in `outcomes`: `stale` (sampled by weights that more than `staleness_bound` of the steps in
    `applied_steps`, those that changed the weights, came after), `zero_variance` (its pool's
    rewards carry no signal; with `keep_without_signal`, a teacher's term to train on, such a
    pool is trained with advantage 0, as are the groups' `unrewarded` members) or `trained`. The staleness of every group the step consumes,
    trained or not, goes into `metrics` (`staleness_mean`, `staleness_max`; `stale_groups`)."""
    # Age is counted in changes of the weights, not in step numbers: an abandoned step (no
    # signal, a NaN) changes nothing, so the groups the same weights go on sampling stay as
    # fresh as they were. An adapter of another run is on none of this run's steps: past any
    # bound.
    behind: dict[str, float] = {}
    current: list[TrainableGroup] = []
    for group in groups:
        served = [c.model for t in group.members for c in calls.get(t, [])]
        steps = [step_of_run(model, alias, run_tag) for model in served]
        behind[group.group_id] = max(
            (math.inf if step is None else _moved_since(applied_steps, step) for step in steps),
            default=0,
        )
        bound = staleness_bound
        if bound and behind[group.group_id] > bound:
            outcomes[group.group_id] = "stale"
        else:
            current.append(group)
    ages = [age for age in behind.values() if age != math.inf]
    if ages:
        metrics["staleness_mean"] = math.fsum(ages) / len(ages)
        metrics["staleness_max"] = max(ages)
    stale = sum(outcome == "stale" for outcome in outcomes.values())
    if stale:
        metrics["stale_groups"] = float(stale)
    # A guided retry shares its unguided group's baseline (advantages.pooled).
    fresh: dict[str, dict[str, float]] = {}
    other_runs = 0
    for pool, members in pooled(current).items():
        rewards = pooled_rewards(members)
        if not has_signal(rewards.values()) and not keep_without_signal:
            outcomes |= {group.group_id: "zero_variance" for group in members}
            continue
        fresh[pool] = rewards
        outcomes |= {group.group_id: "trained" for group in members}
        other_runs += sum(behind[group.group_id] == math.inf for group in members)
    if other_runs:
        metrics["groups_of_other_runs"] = float(other_runs)
    advantages = group_advantages(fresh, scale_by_std=scale_by_std).by_trajectory
    samples = [
        TrajectorySample(t, calls.get(t, []), advantages.get(t, 0.0))
        for rewards in fresh.values()
        for t in rewards
    ]
    if keep_without_signal:  # members without a reward: the teacher's term alone
        unrewarded = [t for group in current for t in group.unrewarded]
        samples += [TrajectorySample(t, calls.get(t, []), 0.0) for t in unrewarded]
        if unrewarded:
            outcomes |= {g.group_id: "trained" for g in current if g.unrewarded}
    return samples


def _moved_since(applied_steps: Sequence[int], step: int) -> int:
    """How many of `applied_steps` (the steps that changed the weights) came after `step`'s
    weights (0: the base model's)."""
    return sum(1 for applied in applied_steps if applied > step)
