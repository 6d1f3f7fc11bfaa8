"""The RULER benchmarks keep working and keep their point (figures come from running them)."""

from __future__ import annotations

from art_proxy.ruler.prompt import approx_tokens
from benchmarks.ruler_agreement import GROUPS
from benchmarks.ruler_tokens import TARGET_AT_8, measure


def test_a_group_of_eight_costs_under_the_target_share_of_judging_each_alone() -> None:
    rows = [measure(size, approx_tokens, seed=0) for size in (4, 8)]
    assert rows[1].ratio <= TARGET_AT_8
    assert rows[1].ratio < rows[0].ratio < 1.0


def test_every_labelled_group_has_four_endings() -> None:
    assert all(len(group.endings) == 4 for group in GROUPS)
