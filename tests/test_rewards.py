"""What a group's rewards say: the reward a judged trajectory trains on, and when a group teaches."""

from __future__ import annotations

import math

from art_proxy.records import TrajectoryScore
from art_proxy.rewards import has_signal, population_std, rewards_by_trajectory


def test_a_judged_trajectory_trains_on_its_reward_not_its_score() -> None:
    scores = [
        TrajectoryScore(trajectory_id=t, label=f"t{i}", score=0.5, explanation="", reward=r)
        for i, (t, r) in enumerate({"a": 1.0, "b": 0.25}.items(), 1)
    ]
    assert rewards_by_trajectory(scores) == {"a": 1.0, "b": 0.25}


def test_a_group_has_signal_only_with_two_different_rewards() -> None:
    assert has_signal([0.0, 1.0])
    assert not has_signal([0.5, 0.5, 0.5])
    assert not has_signal([1.0])
    assert not has_signal([])


def test_a_groups_spread_is_its_population_std() -> None:
    assert population_std([0.0, 1.0]) == 0.5
    assert math.isnan(population_std([]))
