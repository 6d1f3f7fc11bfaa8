"""The RULER benchmarks keep working and keep their point (figures come from running them)."""

from __future__ import annotations

import pytest

from art_proxy.ruler.prompt import approx_tokens
from benchmarks.ruler_agreement import GROUPS, kendall_tau_b
from benchmarks.ruler_tokens import TARGET_AT_8, measure


def test_a_group_of_eight_costs_under_the_target_share_of_judging_each_alone() -> None:
    rows = [measure(size, approx_tokens, seed=0) for size in (4, 8)]
    assert rows[1].ratio <= TARGET_AT_8
    assert rows[1].ratio < rows[0].ratio < 1.0


@pytest.mark.parametrize(
    ("scores", "tau"),
    [
        ([0.9, 0.5, 0.3, 0.1], 1.0),
        ([0.1, 0.3, 0.5, 0.9], -1.0),
        ([0.5, 0.5, 0.5, 0.5], 0.0),
        ([0.9, 0.9, 0.1, 0.1], 0.8165),
    ],
)
def test_kendall_tau_b_against_the_labelled_order(scores: list[float], tau: float) -> None:
    assert kendall_tau_b(scores, [4, 3, 2, 1]) == pytest.approx(tau, abs=1e-4)


def test_every_labelled_group_has_four_endings() -> None:
    assert all(len(group.endings) == 4 for group in GROUPS)
