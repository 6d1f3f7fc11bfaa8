from __future__ import annotations

import pytest

from art_proxy_trainer.advantages import group_advantages


def test_advantages_are_mean_centred_and_zero_variance_groups_are_skipped() -> None:
    advantages = group_advantages(
        {"g1": {"a": 1.0, "b": 0.0, "c": 0.5}, "g2": {"d": 0.7, "e": 0.7}, "g3": {"f": 1.0}}
    )
    assert advantages.by_trajectory == pytest.approx({"a": 0.5, "b": -0.5, "c": 0.0})
    assert (advantages.groups_used, advantages.groups_skipped) == (1, 2)


def test_std_scaling_is_optional() -> None:
    advantages = group_advantages({"g1": {"a": 0.9, "b": 0.1}}, scale_by_std=True)
    assert advantages.by_trajectory == pytest.approx({"a": 1.0, "b": -1.0})
