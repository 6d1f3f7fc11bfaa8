"""The records that cross a process boundary, defined once.

The proxy writes them, the `/art/v1` API and `art-proxy export` read them back, and later the judge
and the trainer consume them. Token ids are the truth for training: `prompt_token_ids` is what the
upstream fed the model, `completion_token_ids[i]` what choice `i` sampled (EOS included), and
`logprobs[i][t]` the sampling logprob of `completion_token_ids[i][t]` (pi_old).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

JsonObject = dict[str, Any]

Split = Literal["train", "val", "prod"]
SPLITS: tuple[Split, ...] = get_args(Split)
CallKind = Literal["chat", "completion"]
# ok: the upstream answered 2xx. upstream_error: it answered 4xx/5xx (passed through to the client).
# failed: it could not be reached, timed out or broke the wire format (the proxy answered 502/504).
# aborted: the client left. rejected: the proxy refused the request (400/413) before the upstream.
CallStatus = Literal["ok", "upstream_error", "failed", "aborted", "rejected"]
TrajectoryStatus = Literal["open", "finished"]
# shadow: an extra sample the proxy drew beside a served prod call (proxy/shadow.py), one call long.
FinishReason = Literal["client", "idle", "shadow"]
# How a call was attributed to its trajectory, strongest first. response: the Responses API's
# `previous_response_id` named a call of it. continuation: the messages extend its last call's
# messages and reply. rerendered: they extend its last call's messages, and the reply comes back
# in another form (an agent that re-renders its history): its tokens are a new training sequence.
# shadow: the proxy's own sample.
Attribution = Literal["url", "header", "response", "continuation", "rerendered", "new", "shadow"]
# The API a client spoke: openai (chat and legacy completions), responses (OpenAI's Responses API)
# or anthropic (Anthropic's Messages API). The proxy speaks chat completions upstream for all three.
Dialect = Literal["openai", "responses", "anthropic"]


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
        "(tool_choice)`, `sampling min_p`, `stream lost tokens`); None when it is, or when it "
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
    """Body of `POST /art/v1/trajectories/{id}/finish`: finite numbers only (JSON has no NaN or
    infinity, so a stored one could not be read back as it was written)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)


JudgmentStatus = Literal["scored", "judge_failed", "skipped"]
# json: the judge writes {id, explanation, score} per trajectory. logprob: one digit 0-9 per
# trajectory, the score is the expectation over the digit tokens' probabilities (small judges).
JudgeMode = Literal["json", "logprob"]


# An ensemble member either scored the group or failed it (the ensemble scores from the rest).
MemberStatus = Literal["scored", "judge_failed"]
# ruler: the reward is the RULER score. mix: a * programmatic + b * RULER score (--reward-mix).
RewardSource = Literal["ruler", "mix"]


class CriterionMark(_Record):
    """One criterion of a checklist rubric, as marked for one trajectory."""

    id: str
    mark: float = Field(
        ge=0.0, le=1.0, description="1 met, 0.5 partially, 0 not (an ensemble: the mean)."
    )
    explanation: str


class TrajectoryScore(_Record):
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
    reward_source: RewardSource = "ruler"

    @model_validator(mode="before")
    @classmethod
    def _reward_defaults_to_score(cls, data: Any) -> Any:
        # Scores stored before hybrid rewards existed carry no reward: it was the score.
        if isinstance(data, dict) and "reward" not in data and "score" in data:
            return {**data, "reward": data["score"]}
        return data


class EnsembleMember(_Record):
    """One judge of an ensemble (or one sample of it): its scores, or why it failed."""

    judge_model: str
    sample: int = Field(description="1 to the number of samples asked of this judge.")
    status: MemberStatus
    reason: str | None = None
    scores: dict[str, float] = Field(
        default_factory=dict, description="Label the judge saw (t1...) -> its score."
    )
    attempts: int = Field(description="Judge calls made (0 for a cache hit).")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class Judgment(_Record):
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
    reward_rule: str = Field(
        default="ruler",
        description="How each score's reward was made: ruler, A*programmatic+B*ruler, or "
        "ruler with the programmatic reward recorded for validation.",
    )
    created_at: datetime


class ExportedTrajectory(_Record):
    """One line of `art-proxy export`: the trajectory, its final conversation and every call."""

    trajectory: TrajectoryRecord
    messages: list[JsonObject] = Field(
        description="The last chat call's messages plus its first choice's reply."
    )
    trainable: bool


# --- Training: adapters served under an alias, and the trainer's steps -------------------------

# trained: its trajectories were in the step's batch. zero_variance: all rewards equal, no signal.
# stale: sampled by an adapter older than the staleness bound allows. no_tokens: nothing trainable
# was recorded. validation: a `val` group, read for the validation reward and never trained on.
# abandoned: in the batch of a step that was abandoned (NaN loss or gradient, out of memory even
# one sequence at a time): consumed, the weights unchanged (the step's reason says why).
GroupOutcome = Literal["trained", "zero_variance", "stale", "no_tokens", "validation", "abandoned"]
# applied: the optimiser moved. abandoned: NaN/inf loss or gradient, or out of memory (see reason).
StepStatus = Literal["applied", "abandoned"]
# swapped: every upstream loaded the adapter and the alias moved. rejected: an upstream refused it
# (the alias stayed). skipped: the step was abandoned, or swapping is off.
SwapStatus = Literal["swapped", "rejected", "skipped"]
# Why an alias moved: a trainer swap, safe promotion, an automatic rollback, or by hand.
MoveReason = Literal["swap", "promote", "rollback", "manual"]
MAX_NOTE = 500  # characters: a line of evidence for a move, not a report


class AliasRecord(_Record):
    """A stable model name agents call; the proxy sends its requests as `model` instead."""

    alias: str
    model: str = Field(description="The served name: the base model or an adapter `alias@step`.")
    step: int | None = Field(default=None, description="The training step of the adapter.")
    updated_at: datetime


class AliasMove(_Record):
    """One move of an alias: the adapter history (which step each alias served when)."""

    alias: str
    model: str
    previous: str | None = Field(description="What the alias served before (None: the name).")
    step: int | None = None
    reason: MoveReason
    note: str | None = Field(
        default=None, description="The evidence for the move, e.g. `val 0.71 >= 0.62 (a@4)`."
    )
    moved_at: datetime


class AliasRequest(_Record):
    """Body of `PUT /art/v1/aliases/{alias}`."""

    model: str = Field(min_length=1, max_length=200)
    step: int | None = None
    reason: MoveReason = "manual"
    note: str | None = Field(default=None, max_length=MAX_NOTE)


class TrainingStep(_Record):
    """One step of one trainer run, and the groups it consumed (each group once per run)."""

    run: str = Field(description="The trainer run (its output directory's name by default).")
    step: int = Field(ge=1)
    status: StepStatus
    reason: str | None = Field(default=None, description="Why the step was abandoned.")
    adapter: str | None = Field(default=None, description="The saved adapter, `alias@step`.")
    swap: SwapStatus | None = None
    swap_error: str | None = Field(default=None, description="What the upstream answered.")
    promotion: str | None = Field(
        default=None,
        description="What safe promotion did with the step's validation (promoted or kept, "
        "and why); None when nothing was up for promotion.",
    )
    groups: dict[str, GroupOutcome] = Field(
        default_factory=dict, description="Group id -> what the step did with it."
    )
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="reward_mean, reward_std, val_reward, loss, grad_norm, kl, clip_fraction, "
        "tokens, skipped_groups, stitch_misses, judge_cost_usd, seconds_<phase>...",
    )
    created_at: datetime


class TrainableGroup(_Record):
    """A group a trainer run has not consumed yet, with the reward of each member to train on."""

    group_id: str
    scenario_id: str
    split: Split = Field(description="The split of its trajectories (they share one).")
    created_at: datetime
    rewards: dict[str, float] = Field(description="Trajectory id -> reward.")
    judge_cost_usd: float = Field(
        0.0, description="What every judgment of the group cost (0 for finish rewards)."
    )


# --- Feedback from production: a user's verdict on a trajectory ---------------------------------

Thumbs = Literal["up", "down"]
MAX_COMMENT = 4000  # characters: a sentence or a paragraph, not a document


class FeedbackRequest(_Record):
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


class LiveReward(_Record):
    """How production rated one served model: finished `prod` trajectories with a reward."""

    model: str = Field(description="The served model (a trajectory counts for its first call's).")
    count: int = Field(ge=0, description="Trajectories with a reward.")
    mean: float | None = Field(description="Their mean reward (None: none has one).")


class Feedback(_Record):
    """One piece of feedback as stored (never the request's headers)."""

    id: str
    trajectory_id: str
    score: float | None = None
    thumbs: Thumbs | None = None
    comment: str | None = None
    created_at: datetime
