"""Feedback from production: a user's verdict on a trajectory, and how each served model fares."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from art_proxy.records.base import Record

Thumbs = Literal["up", "down"]
MAX_COMMENT = 4000  # characters: a sentence or a paragraph, not a document


class FeedbackRequest(Record):
    """Body of `POST /art/v1/feedback`: at least one of score, thumbs and comment."""

    trajectory_id: str = Field(min_length=1, max_length=200)
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    thumbs: Thumbs | None = None
    comment: str | None = Field(default=None, max_length=MAX_COMMENT)
    as_reward: bool = Field(
        default=False,
        description="Also set the trajectory's reward (finished ones only): the score, else "
        "thumbs up = 1 and down = 0.",
    )

    @model_validator(mode="after")
    def _says_something(self) -> FeedbackRequest:
        if self.score is None and self.thumbs is None and self.comment is None:
            raise ValueError("give at least one of score, thumbs and comment")
        if self.as_reward and self.reward is None:
            raise ValueError("as_reward needs a score or thumbs")
        return self

    @property
    def reward(self) -> float | None:
        if self.score is not None:
            return self.score
        return None if self.thumbs is None else float(self.thumbs == "up")


class LiveReward(Record):
    """How production rated one served model: finished `prod` trajectories with a reward."""

    model: str = Field(description="The served model (a trajectory counts for its first call's).")
    count: int = Field(ge=0, description="Trajectories with a reward.")
    mean: float | None = Field(description="Their mean reward (None: none has one).")
    mean_square: float | None = Field(
        default=None, description="The mean of their squared rewards (their spread, with mean)."
    )
    pending: int = Field(
        default=0,
        ge=0,
        description="Finished trajectories still without a reward (feedback or a judge to come).",
    )


class Feedback(Record):
    """One piece of feedback as stored (never the request's headers)."""

    id: str
    trajectory_id: str
    score: float | None = None
    thumbs: Thumbs | None = None
    comment: str | None = None
    created_at: datetime
