"""What a group's rewards say: the reward each judged member trains on, and whether they differ.

GRPO learns only from differences between the members of one group, so the store (handing a trainer
its groups), the trainer (skipping groups without signal, centring the rest) and agents that wait
for trainable groups must agree on what a reward is and when rewards count as equal: this module is
that one answer. It works on plain floats and imports no torch, so the light proxy package holds it.
A group's spread is its population std: the members are the whole group, not a sample of it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from art_proxy.records import AGENT_METRIC_PREFIX, TrajectoryScore

# Rewards closer than this are equal: judges print scores with a few decimals at most.
ZERO_VARIANCE_STD = 1e-6


def rewards_by_trajectory(scores: Iterable[TrajectoryScore]) -> dict[str, float]:
    """Trajectory id -> what it trains on: a judgment's `reward` (the score, or the score mixed
    with the agent's own reward), never the raw `score`."""
    return {score.trajectory_id: score.reward for score in scores}


def mean_or_nan(values: Collection[float]) -> float:
    """NaN for no values: "not measured", which a step's metrics leave out."""
    return math.fsum(values) / len(values) if values else math.nan


def agent_metrics(reported: Iterable[dict[str, float]]) -> dict[str, float]:
    """Step metrics from what each rollout reported beside its reward (`tool_calls`...): for each
    name, `agent/<name>`, its mean over the rollouts that reported it."""
    values: dict[str, list[float]] = {}
    for metrics in reported:
        for name, value in metrics.items():
            if isinstance(value, int | float) and math.isfinite(value):
                values.setdefault(name, []).append(float(value))
    return {f"{AGENT_METRIC_PREFIX}{name}": mean_or_nan(v) for name, v in sorted(values.items())}


def population_std(rewards_G: Collection[float]) -> float:
    """The spread of one group's rewards (NaN for an empty group)."""
    mean = mean_or_nan(rewards_G)
    return math.sqrt(mean_or_nan([(reward - mean) ** 2 for reward in rewards_G]))


def has_signal(rewards_G: Collection[float]) -> bool:
    """Whether a group can teach anything: at least two members whose rewards differ."""
    return len(rewards_G) >= 2 and population_std(rewards_G) >= ZERO_VARIANCE_STD
