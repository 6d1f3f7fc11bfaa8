"""What `art-proxy eval` reports: each arm (a model the agent ran against) on the same held-out
scenarios, its reward with a 95% interval, its paired difference to the reference arm, its latency,
tokens and cost. Written as JSON beside the Markdown table and the chart (evaluation/report.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from art_proxy.records.base import Record

# wilson: the score interval of a 0/1 reward; bootstrap: a percentile bootstrap (rollouts, or
# scenarios for a paired difference); newcombe: a difference of two 0/1 rewards where every
# scenario's difference was the same (intervals.py); none: nothing to estimate from.
IntervalMethod = Literal["wilson", "bootstrap", "newcombe", "none"]
ScoredBy = Literal["agent", "judge"]


class Estimate(Record):
    """A mean with its 95% interval (all None when `n` is 0)."""

    mean: float | None
    low: float | None
    high: float | None
    n: int = Field(description="Rollouts (a reward) or scenarios (a paired difference).")
    method: IntervalMethod

    def __str__(self) -> str:
        if self.mean is None or self.low is None or self.high is None:
            return "-"
        return f"{self.mean:.2f} [{self.low:.2f}, {self.high:.2f}]"

    def signed(self) -> str:
        """As a difference: signed."""
        if self.mean is None or self.low is None or self.high is None:
            return "-"
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


class ArmResult(Record):
    label: str = Field(description="The arm's name in the report.")
    model: str = Field(description="The model name its calls sent.")
    served_by: str = Field(description="proxy: the proxy's upstream; else the arm's own URL.")
    rollouts: int
    failed: int = Field(description="Rollouts whose agent raised or timed out (scored 0).")
    error: str | None = Field(
        None, description="Why the arm did not run, or its first failed rollout's error."
    )
    reward: Estimate
    difference: Estimate | None = Field(
        None, description="Paired difference to the reference arm (None: it is the reference)."
    )
    latency_p50_s: float | None
    latency_p95_s: float | None
    prompt_tokens: float | None = Field(description="Mean prompt tokens of a rollout.")
    completion_tokens: float | None = Field(description="Mean completion tokens of a rollout.")
    cost_per_1000: float | None = Field(
        description="US dollars per 1,000 rollouts (None: unknown)."
    )
    cost_basis: str | None = Field(None, description="Where the cost comes from.")


class EvaluationReport(Record):
    id: str
    created_at: datetime
    agent: str
    scenarios: int
    repeats: int
    reward_source: ScoredBy
    judge: str | None = None
    reference: str = Field(description="The arm every difference is taken against.")
    interrupted: bool = False
    arms: list[ArmResult]
