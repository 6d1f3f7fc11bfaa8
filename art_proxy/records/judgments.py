"""RULER's judgments: a group's scores, an ensemble's members, and the reward each score gives."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from art_proxy.records.base import Record

JudgmentStatus = Literal["scored", "judge_failed", "skipped"]
# json: the judge writes {id, explanation, score} per trajectory. logprob: one digit 0-9 per
# trajectory, the score is the expectation over the digit tokens' probabilities (small judges).
JudgeMode = Literal["json", "logprob"]
# An ensemble member either scored the group or failed it (the ensemble scores from the rest).
MemberStatus = Literal["scored", "judge_failed"]
# What a score's reward was computed from. ruler: the RULER score alone. mix: a * the programmatic
# reward + b * the RULER score (--reward-mix).
RewardFormula = Literal["ruler", "mix"]
# The judge_model of a group judged as it was served (best-of-N, proxy/best_of.py):
# "best-of:<chooser>". Such a group, scored, is not judged again: that ranking chose the answer.
BEST_OF_JUDGE_PREFIX = "best-of:"


class CriterionMark(Record):
    """One criterion of a checklist rubric, as marked for one trajectory."""

    id: str
    mark: float = Field(
        ge=0.0, le=1.0, description="1 met, 0.5 partially, 0 not (an ensemble: the mean)."
    )
    explanation: str


class TrajectoryScore(Record):
    trajectory_id: str
    label: str = Field(description="The short id the judge saw (t1, t2...).")
    score: float = Field(ge=0.0, le=1.0, description="RULER's score (an ensemble: the mean).")
    explanation: str
    std: float | None = Field(
        default=None,
        description="Population std of the ensemble members' scores (None: fewer than two).",
    )
    criteria: list[CriterionMark] = Field(
        default_factory=list,
        description="A checklist rubric's marks; the score is their weighted mean.",
    )
    programmatic: float | None = Field(
        default=None,
        description="The reward the agent reported at finish, where the reward rule uses it.",
    )
    reward: float = Field(
        description="What the trainer uses: the score, or the score mixed with `programmatic`."
    )
    reward_source: RewardFormula = "ruler"

    @model_validator(mode="before")
    @classmethod
    def _reward_defaults_to_score(cls, data: Any) -> Any:
        # Scores stored before hybrid rewards existed carry no reward: it was the score.
        if isinstance(data, dict) and "reward" not in data and "score" in data:
            return {**data, "reward": data["score"]}
        return data


class EnsembleMember(Record):
    """One judge of an ensemble (or one sample of it): its scores, or why it failed."""

    judge_model: str
    sample: int = Field(description="1 to the number of samples asked of this judge.")
    order: int = Field(
        default=1, description="Which of the orders the group was shown in (1: as given)."
    )
    status: MemberStatus
    reason: str | None = None
    scores: dict[str, float] = Field(
        default_factory=dict,
        description="Label (t1..., as the first order shows them) -> its score.",
    )
    attempts: int = Field(description="Judge calls made (0 for a cache hit).")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class Judgment(Record):
    """RULER's verdict on one group: scores comparable within the group, not across groups."""

    id: str
    group_id: str
    judge_model: str = Field(
        description="The judge, or an ensemble's judges joined by + (*N: N samples of each)."
    )
    mode: JudgeMode
    rubric_hash: str
    cache_key: str = Field(description="Hash of judge model, mode and the rendered judge prompt.")
    status: JudgmentStatus
    reason: str | None = Field(
        default=None, description="Why the group was skipped or the judge failed."
    )
    trajectory_ids: list[str] = Field(description="Members judged, in the order shown (t1...).")
    scores: list[TrajectoryScore] = Field(default_factory=list)
    attempts: int = Field(description="Judge calls made (0 for a cache hit or a skip).")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = Field(0.0, description="As priced by litellm; 0 for local models.")
    cached_from: str | None = Field(
        default=None, description="The judgment whose answer was reused (a cache hit)."
    )
    members: list[EnsembleMember] = Field(
        default_factory=list,
        description="An ensemble's members, failed ones with their reason (empty: one judge).",
    )
    rank_agreement: float | None = Field(
        default=None,
        description="Mean Kendall tau-b between every two scored members' rankings: 1 = all "
        "rank alike, 0 = unrelated (None: fewer than two scored).",
    )
    order_agreement: float | None = Field(
        default=None,
        description="Mean Kendall tau-b between every two orders' scores of the group "
        "(--judge-orders): near 1 the judge scored the trajectories, near 0 or below their "
        "positions (None: one order).",
    )
    reward_rule: str = Field(
        default="ruler",
        description="How each score's reward was made: ruler, A*programmatic+B*ruler, or "
        "ruler with the programmatic reward recorded for validation.",
    )
    created_at: datetime


class JudgeCheckRecord(Record):
    """What `art-proxy judge --check` found of a judge with a rubric (ruler/check.py), kept so
    that a trainer reading its judgments knows whether they can be trained on."""

    judge_model: str = Field(description="As its judgments name it (Judgment.judge_model).")
    rubric_hash: str
    passed: bool
    failed: bool = Field(
        description="Measured and below the threshold (neither: nothing measured)."
    )
    consistency: float | None
    agreement: float | None
    threshold: float
    groups: int
    line: str = Field(description="What the check printed.")
    created_at: datetime
