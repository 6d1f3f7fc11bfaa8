from __future__ import annotations

from datetime import UTC, datetime

import pytest

from art_proxy.records import Judgment, TrajectoryScore
from art_proxy_trainer.advantages import group_advantages, rewards_by_group


def test_advantages_are_mean_centred_and_zero_variance_groups_are_skipped() -> None:
    advantages = group_advantages(
        {"g1": {"a": 1.0, "b": 0.0, "c": 0.5}, "g2": {"d": 0.7, "e": 0.7}, "g3": {"f": 1.0}}
    )
    assert advantages.by_trajectory == pytest.approx({"a": 0.5, "b": -0.5, "c": 0.0})
    assert (advantages.groups_used, advantages.groups_skipped) == (1, 2)


def test_std_scaling_is_optional() -> None:
    advantages = group_advantages({"g1": {"a": 0.9, "b": 0.1}}, scale_by_std=True)
    assert advantages.by_trajectory == pytest.approx({"a": 1.0, "b": -1.0})


def _judgment(group_id: str, status: str, rewards: dict[str, float]) -> Judgment:
    return Judgment.model_validate(
        {
            "id": f"j-{group_id}",
            "group_id": group_id,
            "judge_model": "judge",
            "mode": "json",
            "rubric_hash": "r",
            "cache_key": "k",
            "status": status,
            "trajectory_ids": list(rewards),
            "scores": [
                TrajectoryScore(trajectory_id=t, label=f"t{i}", score=0.5, explanation="", reward=r)
                for i, (t, r) in enumerate(rewards.items(), 1)
            ],
            "attempts": 1,
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        }
    )


def test_rewards_come_from_scored_judgments_only() -> None:
    judgments = [
        _judgment("g1", "scored", {"a": 1.0, "b": 0.25}),
        _judgment("g2", "judge_failed", {}),
    ]
    assert rewards_by_group(judgments) == {"g1": {"a": 1.0, "b": 0.25}}
