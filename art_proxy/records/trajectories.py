"""Calls, trajectories, groups and scenarios: what the proxy records and `art-proxy export` reads.

Token ids are the truth for training: `prompt_token_ids` is what the upstream fed the model,
`completion_token_ids[i]` what choice `i` sampled (EOS included), and `logprobs[i][t]` the sampling
logprob of `completion_token_ids[i][t]` (pi_old).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, get_args

from pydantic import ConfigDict, Field

from art_proxy.records.base import JsonObject, Record

# eval: an `art-proxy eval` run's rollouts (evaluation/): never judged into training groups,
# never trained on, never a validation.
Split = Literal["train", "val", "prod", "eval"]
# What a scenario (and a client's default) may be: an evaluation's split is the command's own.
ScenarioSplit = Literal["train", "val", "prod"]
SPLITS: tuple[Split, ...] = get_args(Split)
SCENARIO_SPLITS: tuple[ScenarioSplit, ...] = get_args(ScenarioSplit)
CallKind = Literal["chat", "completion"]
# ok: the upstream answered 2xx. upstream_error: it answered 4xx/5xx (passed through to the client).
# failed: it could not be reached, timed out or broke the wire format (the proxy answered 502/504).
# aborted: the client left. rejected: the proxy refused the request (400/413) before the upstream.
CallStatus = Literal["ok", "upstream_error", "failed", "aborted", "rejected"]
TrajectoryStatus = Literal["open", "finished"]
# shadow: an extra sample the proxy drew beside a served prod call (proxy/shadow.py), one call long.
# best_of: one of the candidates of a best-of-N call (proxy/best_of.py), one call long.
FinishReason = Literal["client", "idle", "shadow", "best_of"]
# The metadata key of a trajectory whose agent raised or timed out (the rollout runner sets it);
# judging leaves such a trajectory out.
ROLLOUT_ERROR = "rollout_error"
# How a call was attributed to its trajectory, strongest first. response: the Responses API's
# `previous_response_id` named a call of it. continuation: the messages extend its last call's
# messages and reply. rerendered: they extend its last call's messages, and the reply comes back
# in another form (an agent that re-renders its history): its tokens are a new training sequence.
# shadow, best_of: the proxy's own sample.
Attribution = Literal[
    "url", "header", "response", "continuation", "rerendered", "new", "shadow", "best_of"
]
# The metadata of a shadow sample, of a best-of candidate: the trajectory it was drawn from.
SHADOW_OF, BEST_OF = "shadow_of", "best_of"
# The API a client spoke: openai (chat and legacy completions), responses (OpenAI's Responses API)
# or anthropic (Anthropic's Messages API). The proxy speaks chat completions upstream for all three.
Dialect = Literal["openai", "responses", "anthropic"]


class Guidance(Record):
    """Text a guided retry added to a call's prompt upstream (proxy/guidance.py): the model was
    sampled with it, the trainer scores the tokens without it (the recorded logprobs, taken with
    it, enter through the importance weight)."""

    text: str
    start: int = Field(description="Where the guidance's tokens begin in `prompt_token_ids`.")
    end: int = Field(description="Where they end (exclusive): the trainer leaves [start, end) out.")


class CallRecord(Record):
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
    model: str | None = Field(
        description="The model the upstream served: a model alias's target (`alias@step`), "
        "else the client's `model`; `request` keeps the name the client asked for."
    )
    request: JsonObject = Field(
        description="The body the client sent, unchanged; for the responses and anthropic "
        "dialects, the chat-completions body it was translated to (`client_request` has the "
        "client's own)."
    )
    response: JsonObject | None = Field(
        description="The answer as the client received it (rebuilt from the chunks for a "
        "stream), in chat-completions form whatever the dialect; token ids and logprobs are in "
        "their own fields."
    )
    sampling: JsonObject = Field(description="Sampling parameters the client set (temperature...).")
    prompt_token_ids: list[int] | None
    completion_token_ids: list[list[int]] | None = Field(description="Per choice, EOS included.")
    logprobs: list[list[float]] | None = Field(description="Per choice, one per completion id.")
    trainable: bool = Field(
        description="Token ids and logprobs were captured for every choice, and the trainer can "
        "score them with the distribution they were sampled from."
    )
    untrainable_reason: str | None = Field(
        default=None,
        description="Why an answered call is not trainable (e.g. `guided decoding "
        "(structured_outputs grammar)`, `stream lost tokens`); None when it is, or when it "
        "failed.",
    )
    stitched: bool = Field(
        description="The prompt ids extend the previous call's prompt plus completion ids."
    )
    attribution: Attribution
    dialect: Dialect = "openai"
    client_request: JsonObject | None = Field(
        default=None,
        description="The body the client sent in the responses or anthropic dialect (None for "
        "openai, whose `request` is the client's own).",
    )
    guidance: Guidance | None = Field(
        default=None,
        description="Guidance added upstream (X-Art-Guidance): `request` is the body without it, "
        "`prompt_token_ids` what the model saw, with it.",
    )


class TrajectoryRecord(Record):
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
    user_id: str | None = Field(
        default=None,
        description="The user whose conversation it is: X-Art-User, else the request's "
        "`safety_identifier` or `user` (Anthropic: `metadata.user_id`).",
    )
    tenant_id: str | None = Field(default=None, description="The caller's X-Art-Tenant.")
    calls: list[CallRecord] | None = Field(
        default=None, description="Present when the trajectory is read whole."
    )


class GroupRecord(Record):
    """Trajectories of one scenario that ran side by side: what RULER ranks against each other."""

    id: str
    scenario_id: str
    created_at: datetime
    size: int
    open_count: int = Field(description="Members not finished yet.")
    newest_started_at: datetime | None = Field(
        default=None, description="When its newest member started (the judge waits from it)."
    )


class ScenarioRecord(Record):
    id: str
    created_at: datetime
    auto: bool = Field(
        description="Keyed by the proxy (hash of the opening) rather than the agent."
    )
    opening: list[JsonObject] = Field(
        description="The conversation before the first assistant turn, as first seen."
    )


class FinishRequest(Record):
    """Body of `POST /art/v1/trajectories/{id}/finish`: finite numbers only (JSON has no NaN or
    infinity, so a stored one could not be read back as it was written)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)


class ExportedTrajectory(Record):
    """One line of `art-proxy export`: the trajectory, its final conversation and every call."""

    trajectory: TrajectoryRecord
    messages: list[JsonObject] = Field(
        description="The last chat call's messages plus its first choice's reply."
    )
    trainable: bool
    judged_reward: float | None = Field(
        default=None,
        description="Its reward in the newest scored judgment of its group (RULER's), if any; "
        "`trajectory.reward` is the one the agent reported or a user's feedback set.",
    )
