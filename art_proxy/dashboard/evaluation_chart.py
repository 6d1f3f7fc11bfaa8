"""The Evaluations page's chart of a report: each arm's reward with its 95% interval, side by side
(what `eval` writes as report.png, drawn here as the page's own SVG)."""

from __future__ import annotations

from art_proxy.records import EvaluationReport

from .plots import IntervalChart, interval_chart


def evaluation_chart(report: EvaluationReport) -> IntervalChart | None:
    """None when no arm measured anything."""
    return interval_chart(
        "Reward by arm (95% interval)",
        [(arm.label, arm.reward.mean, arm.reward.low, arm.reward.high) for arm in report.arms],
        x_title="reward",
    )
