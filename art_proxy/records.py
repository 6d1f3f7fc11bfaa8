"""The records that cross a process boundary, defined once.

The proxy writes them, the `/art/v1` API and `art-proxy export` read them back, and later the judge
and the trainer consume them. Token ids are the truth for training: `prompt_token_ids` is what the
upstream fed the model, `completion_token_ids[i]` what choice `i` sampled (EOS included), and
`logprobs[i][t]` the sampling logprob of `completion_token_ids[i][t]` (pi_old).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JsonObject = dict[str, Any]

Split = Literal["train", "val", "prod"]
CallKind = Literal["chat", "completion"]
# ok: the upstream answered 2xx. upstream_error: it answered 4xx/5xx (passed through to the client).
# failed: it could not be reached or timed out (the proxy answered 502/504). aborted: the client left.
CallStatus = Literal["ok", "upstream_error", "failed", "aborted"]
TrajectoryStatus = Literal["open", "finished"]
FinishReason = Literal["client", "idle"]
# How a call was attributed to its trajectory, strongest first.
Attribution = Literal["url", "header", "continuation", "new"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CallRecord(_Record):
    """One request to the upstream, as the proxy saw it (never headers: they may hold secrets)."""

    id: str
    trajectory_id: str
    seq: int = Field(description="Position of the call in its trajectory, from 0.")
    kind: CallKind
    created_at: datetime
    latency_ms: float
    upstream: str
    status: CallStatus
    http_status: int
    error: str | None = None
    stream: bool
    model: str | None
    request: JsonObject = Field(description="The body the client sent, unchanged.")
    response: JsonObject | None = Field(
        description="The answer as the client received it (rebuilt from the chunks for a "
        "stream); token ids and logprobs are in their own fields."
    )
    sampling: JsonObject = Field(description="Sampling parameters the client set (temperature...).")
    prompt_token_ids: list[int] | None
    completion_token_ids: list[list[int]] | None = Field(description="Per choice, EOS included.")
    logprobs: list[list[float]] | None = Field(description="Per choice, one per completion id.")
    trainable: bool = Field(description="Token ids and logprobs were captured for every choice.")
    stitched: bool = Field(
        description="The prompt ids extend the previous call's prompt plus completion ids."
    )
    attribution: Attribution


class TrajectoryRecord(_Record):
    id: str
    scenario_id: str
    group_id: str
    split: Split
    status: TrajectoryStatus
    finish_reason: FinishReason | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    upstream: str
    call_count: int
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)
    calls: list[CallRecord] | None = Field(
        default=None, description="Present when the trajectory is read whole."
    )


class GroupRecord(_Record):
    """Trajectories of one scenario that ran side by side: what RULER ranks against each other."""

    id: str
    scenario_id: str
    created_at: datetime
    size: int
    open_count: int = Field(description="Members not finished yet.")
    newest_started_at: datetime | None = Field(
        default=None, description="When its newest member started (the judge waits from it)."
    )


class ScenarioRecord(_Record):
    id: str
    created_at: datetime
    auto: bool = Field(
        description="Keyed by the proxy (hash of the opening) rather than the agent."
    )
    opening: list[JsonObject] = Field(
        description="The conversation before the first assistant turn, as first seen."
    )


class FinishRequest(_Record):
    """Body of `POST /art/v1/trajectories/{id}/finish`."""

    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)


JudgmentStatus = Literal["scored", "judge_failed", "skipped"]
# json: the judge writes {id, explanation, score} per trajectory. logprob: one digit 0-9 per
# trajectory, the score is the expectation over the digit tokens' probabilities (small judges).
JudgeMode = Literal["json", "logprob"]


class TrajectoryScore(_Record):
    trajectory_id: str
    label: str = Field(description="The short id the judge saw (t1, t2...).")
    score: float = Field(ge=0.0, le=1.0)
    explanation: str


class Judgment(_Record):
    """RULER's verdict on one group: scores comparable within the group, not across groups."""

    id: str
    group_id: str
    judge_model: str
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
    created_at: datetime


class ExportedTrajectory(_Record):
    """One line of `art-proxy export`: the trajectory, its final conversation and every call."""

    trajectory: TrajectoryRecord
    messages: list[JsonObject] = Field(
        description="The last chat call's messages plus its first choice's reply."
    )
    trainable: bool
