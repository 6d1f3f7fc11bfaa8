"""Training: adapters served under an alias, the trainer's steps, and the groups it trains on."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from art_proxy.records.base import Record
from art_proxy.records.feedback import LiveReward
from art_proxy.records.trajectories import Split

# trained: its trajectories were in the step's batch. zero_variance: all rewards equal, no signal.
# stale: sampled by an adapter older than the staleness bound allows. no_tokens: nothing trainable
# was recorded. validation: a `val` group, read for the validation reward and never trained on.
# abandoned: in the batch of a step that was abandoned (NaN loss or gradient, out of memory even
# one sequence at a time): consumed, the weights unchanged (the step's reason says why).
GroupOutcome = Literal["trained", "zero_variance", "stale", "no_tokens", "validation", "abandoned"]
# applied: the optimiser moved. abandoned: NaN/inf loss or gradient, or out of memory (see reason).
StepStatus = Literal["applied", "abandoned"]
# grpo: a policy-gradient step on scored groups. sft: a warm-start step, supervised on
# demonstrations (no groups consumed).
StepKind = Literal["grpo", "sft"]
# swapped: every upstream loaded the adapter and the alias moved. rejected: an upstream refused it
# (the alias stayed). skipped: the step was abandoned, or swapping is off.
SwapStatus = Literal["swapped", "rejected", "skipped"]
# Why an alias moved: a trainer swap, safe promotion, an automatic rollback, or by hand; canary: a
# candidate began serving a share of new trajectories beside the target (or its share changed),
# the alias itself unmoved; kept: a canary ended with no difference worth acting on, the target
# kept. A rollback also ends a canary whose candidate was worse (the target kept).
MoveReason = Literal["swap", "promote", "rollback", "manual", "canary", "kept"]
MAX_NOTE = 500  # characters: a line of evidence for a move, not a report
# A canary's verdict at one look: promote the candidate, roll it back, keep the target (no
# difference worth acting on), or hold (look again).
CanaryVerdict = Literal["promote", "rollback", "keep", "hold"]


class AliasRecord(Record):
    """A stable model name agents call; the proxy sends its requests as `model` instead."""

    alias: str
    model: str = Field(description="The served name: the base model or an adapter `alias@step`.")
    step: int | None = Field(default=None, description="The training step of the adapter.")
    updated_at: datetime
    canary: str | None = Field(
        default=None,
        description="A candidate serving a share of the alias's new trajectories beside its "
        "target, so that both are measured on the same traffic (None: no canary).",
    )
    canary_fraction: float = Field(
        default=0.0, ge=0, le=1, description="The share of new trajectories the canary serves."
    )
    canary_since: datetime | None = Field(
        default=None, description="When the canary began: its evidence counts from then."
    )


class Lease(Record):
    """A model open trajectories hold (proxy/leases.py): the trainer keeps it loaded."""

    model: str
    trajectories: int = Field(description="Open trajectories whose calls it served.")


class AliasMove(Record):
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
    fraction: float | None = Field(
        default=None,
        description="A `canary` move's share of new trajectories (None: any other move).",
    )


class CanaryLook(Record):
    """One look of the trainer at a running canary's evidence (its promoter writes one whenever
    the evidence changed): both arms' live rewards since the canary began, the anytime-valid
    interval on their difference, and what it decided. Aggregates only: an erasure takes its
    trajectories out of the next look."""

    alias: str
    looked_at: datetime
    fraction: float = Field(ge=0, le=1, description="The candidate's share of new trajectories.")
    candidate: LiveReward
    target: LiveReward
    difference: float = Field(description="The candidate's mean live reward minus the target's.")
    low: float | None = Field(
        description="The interval's bounds (None: too few scored trajectories an arm yet)."
    )
    high: float | None
    verdict: CanaryVerdict
    note: str = Field(max_length=MAX_NOTE, description="The evidence line, as the move keeps it.")


class AliasRequest(Record):
    """Body of `PUT /art/v1/aliases/{alias}`."""

    model: str = Field(min_length=1, max_length=200)
    step: int | None = None
    reason: MoveReason = "manual"
    note: str | None = Field(default=None, max_length=MAX_NOTE)
    fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="With reason `canary`: the share of new trajectories `model` serves beside "
        "the alias's target, which does not move (0 ends the canary; 1 serves it alone).",
    )
    canary_since: datetime | None = Field(
        default=None,
        description="The move decides (ends, or widens) the canary that began then: refused "
        "(409) when none or another runs, so a decision taken on stale evidence (a second "
        "trainer, an operator's move in between) never resurrects or overrides one.",
    )

    @model_validator(mode="after")
    def _a_canary_has_a_share(self) -> AliasRequest:
        if (self.reason == "canary") != (self.fraction is not None):
            raise ValueError("a canary (reason `canary`) and its `fraction` go together")
        return self


# A step's metric named so is the mean of one metric its training rollouts reported.
AGENT_METRIC_PREFIX = "agent/"


class TrainingStep(Record):
    """One step of one trainer run, and the groups it consumed (each group once per run)."""

    run: str = Field(description="The trainer run (its output directory's name by default).")
    step: int = Field(ge=1)
    kind: StepKind = "grpo"
    status: StepStatus
    reason: str | None = Field(default=None, description="Why the step was abandoned.")
    adapter: str | None = Field(
        default=None, description="The saved adapter, `alias@step-run` (its run's tag)."
    )
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
        description="reward_mean, reward_std, val_reward, val_reward_base (the run's first "
        "step: the base model's validation before it), loss, grad_norm, kl, clip_fraction, "
        "update_drift (loss to update_drift: means over the step's updates; with several, "
        "updates, loss_last, clip_fraction_last and update_drift_last are the last update's), "
        "mean_ratio, is_weight_std, is_capped, mismatch, mismatch_kl, entropy, staleness_mean, "
        "staleness_max (of every group the step consumed, in changes of the weights), "
        "stale_groups, val_of_step (the step whose weights the validation measured), "
        "pipeline_trainer_wait_s, pipeline_validation_wait_s, pipeline_steps_ahead, groups_of_other_runs, tokens, too_long_rows, fewer_updates_rows, "
        "skipped_groups, stitch_misses, judge_cost_usd, "
        "seconds_<phase>, and agent/<name>: the mean of what the step's training rollouts "
        "reported as metrics (RolloutOutcome.metrics)...",
    )
    created_at: datetime


class TrainableGroup(Record):
    """A group a trainer run has not consumed yet, with the reward of each member to train on."""

    group_id: str
    scenario_id: str
    split: Split = Field(description="The split of its trajectories (they share one).")
    created_at: datetime
    rewards: dict[str, float] = Field(description="Trajectory id -> reward.")
    unrewarded: list[str] = Field(
        default_factory=list,
        description="Members without a reward (`--reward-source teacher`): trained on a "
        "teacher's term alone, never on a reward.",
    )
    judge_cost_usd: float = Field(
        0.0, description="What every judgment of the group cost (0 for finish rewards)."
    )
    judged_at: datetime | None = Field(
        default=None, description="When its newest scored judgment was written (None: finish)."
    )
    judged_by: tuple[str, str] | None = Field(
        default=None,
        description="The judge model and rubric hash of its newest scored judgment (None: "
        "finish): whose check says whether the rewards can be trained on.",
    )
    baseline_group: str | None = Field(
        default=None,
        description="A guided retry's unguided group: the retry's advantages are taken against "
        "both groups' rewards together, since the policy trained is the one without the hint.",
    )

    @property
    def members(self) -> list[str]:
        """Every member trajectory to train on: the rewarded ones, then the unrewarded."""
        return [*self.rewards, *self.unrewarded]


class TokenDisagreement(Record):
    """A sampled token the teacher would least have written: the sampler's logprob of it far
    above the teacher's."""

    position: int = Field(description="Its index in the choice's completion ids.")
    text: str = Field(description="The token as the trainer's tokenizer decodes it.")
    sampled: float = Field(description="log mu: the sampler's logprob, as recorded.")
    teacher: float = Field(description="log p_teacher of the same token after the same ids.")


class TeacherScore(Record):
    """What a teacher said of one trained choice of a call (on-policy distillation): the mean
    reverse KL over its tokens and the tokens where student and teacher disagree most."""

    call_id: str
    choice: int
    trajectory_id: str
    run: str
    step: int
    teacher: str = Field(description="The teacher model's name.")
    kl: float = Field(description="Mean of log mu - log p_teacher over the choice's tokens.")
    tokens: int
    disagreements: list[TokenDisagreement] = Field(
        description="The most disagreed tokens, most first (a few: what the page shows)."
    )
    created_at: datetime
