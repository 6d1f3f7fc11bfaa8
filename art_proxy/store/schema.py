"""Tables of the trajectory store (SQLAlchemy Core; the same code for SQLite and PostgreSQL).

The Alembic migrations in `migrations/versions/` create exactly these tables; a test compares them.
Token ids and logprobs are JSON arrays: they are written once and read whole by the trainer, never
queried element by element.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

metadata = sa.MetaData()

# JSONB on PostgreSQL (compact, indexable later), plain JSON text on SQLite.
Json = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)

scenarios = sa.Table(
    "scenarios",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("auto", sa.Boolean, nullable=False),
    sa.Column("opening", Json, nullable=False),
)

groups = sa.Table(
    "groups",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("scenario_id", sa.String(200), sa.ForeignKey("scenarios.id"), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Index("ix_groups_scenario_created", "scenario_id", "created_at"),
    # Lists, newest first: a page read from the index's end instead of sorting every row
    # (migration 0012). So for trajectories and judgments below.
    sa.Index("ix_groups_created", "created_at", "id"),
)

trajectories = sa.Table(
    "trajectories",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("scenario_id", sa.String(200), sa.ForeignKey("scenarios.id"), nullable=False),
    sa.Column("group_id", sa.String(64), sa.ForeignKey("groups.id"), nullable=False),
    sa.Column("split", sa.String(8), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("finish_reason", sa.String(16)),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("finished_at", Timestamp),
    sa.Column("upstream", sa.String(500), nullable=False),
    sa.Column("call_count", sa.Integer, nullable=False),
    sa.Column("reward", sa.Float),
    sa.Column("metrics", Json, nullable=False),
    sa.Column("metadata", Json, nullable=False),
    # Continuation key of the latest answered call: the call an unmodified agent's next call
    # extends (see proxy/tracker.py). Only open trajectories are looked up by it.
    sa.Column("tip_key", sa.String(64)),
    # The same call's messages without its reply: an agent that re-renders the reply is found by
    # them (migration 0009).
    sa.Column("tip_prompt_key", sa.String(64)),
    # Whose conversation it is (X-Art-User / X-Art-Tenant, else the body's user field): what
    # `art-proxy forget` erases by and lists filter by (migration 0015).
    sa.Column("user_id", sa.String(200)),
    sa.Column("tenant_id", sa.String(200)),
    sa.Index("ix_trajectories_group", "group_id"),
    sa.Index("ix_trajectories_user", "user_id", "created_at"),
    sa.Index("ix_trajectories_tenant", "tenant_id", "created_at"),
    sa.Index("ix_trajectories_scenario_status", "scenario_id", "status"),
    # Open trajectories by their last call, for housekeeping (idle ones to finish, groups active
    # in the last second). Partial, and not led by `status`: without statistics SQLite's planner
    # took a `(status, ...)` index for any `status = ?`, reading every finished trajectory to find
    # a few groups' members (migration 0011). Only a query that says `status = 'open'` in its text
    # (`IS_OPEN`) can use it: a bound parameter cannot show the planner that the index applies.
    sa.Index(
        "ix_trajectories_open_updated",
        "updated_at",
        sqlite_where=sa.text("status = 'open'"),
        postgresql_where=sa.text("status = 'open'"),
    ),
    sa.Index("ix_trajectories_tip_key", "tip_key"),
    sa.Index("ix_trajectories_tip_prompt_key", "tip_prompt_key"),
    # The live reward of a serving period (store/feedback.py, the rollback watch).
    sa.Index("ix_trajectories_split_status_created", "split", "status", "created_at"),
    sa.Index("ix_trajectories_created", "created_at", "id"),
)

# The condition that lets a query use `ix_trajectories_open_updated` (see there).
IS_OPEN = trajectories.c.status == sa.literal_column("'open'")


calls = sa.Table(
    "calls",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("trajectory_id", sa.String(200), sa.ForeignKey("trajectories.id"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("upstream", sa.String(500), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("http_status", sa.Integer, nullable=False),
    sa.Column("error", sa.Text),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("model", sa.String(200)),
    sa.Column("request", Json, nullable=False),
    sa.Column("response", Json),
    sa.Column("sampling", Json, nullable=False),
    sa.Column("prompt_token_ids", Json),
    sa.Column("completion_token_ids", Json),
    sa.Column("logprobs", Json),
    sa.Column("trainable", sa.Boolean, nullable=False),
    sa.Column("untrainable_reason", sa.String(200)),
    sa.Column("stitched", sa.Boolean, nullable=False),
    sa.Column("attribution", sa.String(16), nullable=False),
    # Hash of the call's messages plus its reply: the next call of the same conversation starts
    # with exactly that, which is how an unmodified agent's calls are stitched (attribution.py).
    sa.Column("continuation_key", sa.String(64)),
    # The API the client spoke (records.Dialect) and, where it is not chat completions' own, the
    # body the client sent; `request` holds the chat-completions body sent upstream (migration 0009).
    sa.Column("dialect", sa.String(16), nullable=False, server_default="openai"),
    sa.Column("client_request", Json),
    # records.Guidance of a guided retry's call: the text and where its tokens sit (migration 0016).
    sa.Column("guidance", Json),
    # Not indexed by `continuation_key`: stitching reaches a call through its trajectory's tip
    # (migration 0010).
    # Unique (migration 0013): two calls at one seq would train on a conversation never held.
    sa.Index("ix_calls_trajectory_seq", "trajectory_id", "seq", unique=True),
)

# RULER's verdicts (records.Judgment). A group may have several: one per judge (or ensemble),
# rubric and reward rule, and a retried `judge_failed` one keeps its failed predecessor as history.
judgments = sa.Table(
    "judgments",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("group_id", sa.String(64), sa.ForeignKey("groups.id"), nullable=False),
    sa.Column("judge_model", sa.String(1000), nullable=False),  # an ensemble names every judge
    sa.Column("mode", sa.String(16), nullable=False),
    sa.Column("rubric_hash", sa.String(64), nullable=False),
    sa.Column("cache_key", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("trajectory_ids", Json, nullable=False),
    sa.Column("scores", Json, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False),
    sa.Column("cached_from", sa.String(64)),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("members", Json),  # records.EnsembleMember; NULL before migration 0003
    sa.Column("rank_agreement", sa.Float),
    sa.Column("reward_rule", sa.String(200), nullable=False, server_default="ruler"),
    sa.Column("order_agreement", sa.Float),  # migration 0018
    sa.Index("ix_judgments_group_judge", "group_id", "judge_model", "rubric_hash"),
    sa.Index("ix_judgments_cache_key", "cache_key"),
    sa.Index("ix_judgments_created", "created_at", "id"),
)

# What `judge --check` found of a judge and rubric (records.JudgeCheckRecord, migration 0023): a
# trainer refuses the judgments of one whose newest check failed.
judge_checks = sa.Table(
    "judge_checks",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("judge_model", sa.String(1000), nullable=False),
    sa.Column("rubric_hash", sa.String(64), nullable=False),
    sa.Column("passed", sa.Boolean, nullable=False),
    sa.Column("failed", sa.Boolean, nullable=False),
    sa.Column("consistency", sa.Float),
    sa.Column("agreement", sa.Float),
    sa.Column("threshold", sa.Float, nullable=False),
    sa.Column("groups", sa.Integer, nullable=False),
    sa.Column("line", sa.Text, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Index("ix_judge_checks_judge", "judge_model", "rubric_hash", "created_at"),
)

# --- Training: model aliases, their history, the trainer's steps and the groups they consumed ---

# The model name each alias serves now (records.AliasRecord); proxies poll it every second.
aliases = sa.Table(
    "aliases",
    metadata,
    sa.Column("alias", sa.String(200), primary_key=True),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("step", sa.Integer),
    sa.Column("updated_at", Timestamp, nullable=False),
    # A canary (records.AliasRecord): a candidate serving a share of new trajectories.
    sa.Column("canary", sa.String(200)),
    sa.Column("canary_fraction", sa.Float, nullable=False, server_default="0"),
    sa.Column("canary_since", Timestamp),
)

# Every move of an alias (records.AliasMove): which adapter served when, and why it moved.
alias_moves = sa.Table(
    "alias_moves",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("alias", sa.String(200), nullable=False),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("previous", sa.String(200)),
    sa.Column("step", sa.Integer),
    sa.Column("reason", sa.String(16), nullable=False),
    sa.Column("moved_at", Timestamp, nullable=False),
    sa.Column("note", sa.String(500)),  # the evidence for the move; NULL before migration 0006
    sa.Column("fraction", sa.Float),  # a canary move's share (migration 0025)
    sa.Index("ix_alias_moves_alias_moved", "alias", "moved_at"),
)

# A running canary's evidence at each look of its decider (records.CanaryLook, migration 0025):
# aggregates of both arms, the interval and the verdict; what the dashboard and /metrics show.
canary_looks = sa.Table(
    "canary_looks",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("alias", sa.String(200), nullable=False),
    sa.Column("looked_at", Timestamp, nullable=False),
    sa.Column("fraction", sa.Float, nullable=False),
    sa.Column("candidate", Json, nullable=False),
    sa.Column("target", Json, nullable=False),
    sa.Column("difference", sa.Float, nullable=False),
    sa.Column("low", sa.Float),
    sa.Column("high", sa.Float),
    sa.Column("verdict", sa.String(16), nullable=False),
    sa.Column("note", sa.String(500), nullable=False),
    sa.Index("ix_canary_looks_alias_looked", "alias", "looked_at"),
)

# The models each running proxy's open trajectories hold in its memory (proxy/lease_publisher.py),
# replaced whole by that proxy every few seconds: a lease whose first call is still running or
# journaled, which the calls above do not show yet. Rows not refreshed lately are a stopped proxy's.
proxy_leases = sa.Table(
    "proxy_leases",
    metadata,
    sa.Column("proxy_id", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(200), primary_key=True),
    sa.Column("trajectories", sa.Integer, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
)

# One row per step of a trainer run (records.TrainingStep); `groups` repeats consumed_groups
# so a step reads back whole.
training_steps = sa.Table(
    "training_steps",
    metadata,
    sa.Column("run", sa.String(200), primary_key=True),
    sa.Column("step", sa.Integer, primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("adapter", sa.String(200)),
    sa.Column("swap", sa.String(16)),
    sa.Column("swap_error", sa.Text),
    sa.Column("groups", Json, nullable=False),
    sa.Column("metrics", Json, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("promotion", sa.Text),  # what safe promotion did at this step (migration 0006)
    sa.Column("kind", sa.String(8), nullable=False, server_default="grpo"),  # migration 0014
)

# The primary key is the invariant: a run consumes each group at exactly one step, whatever the
# caller does (a resumed trainer, two trainers under one run name).
consumed_groups = sa.Table(
    "consumed_groups",
    metadata,
    sa.Column("run", sa.String(200), primary_key=True),
    sa.Column("group_id", sa.String(64), sa.ForeignKey("groups.id"), primary_key=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("consumed_at", Timestamp, nullable=False),
)

# The groups a step is training on now, claimed before it reads their calls and let go when the
# step is recorded (migration 0021): an erasure meanwhile finds the step in its lineage. No foreign
# key: an erased group's claim still names what the step holds in memory.
step_claims = sa.Table(
    "step_claims",
    metadata,
    sa.Column("run", sa.String(200), primary_key=True),
    sa.Column("group_id", sa.String(64), primary_key=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("claimed_at", Timestamp, nullable=False),
)

# A teacher's word on a trained choice (records.TeacherScore, migration 0022): its KL and the
# tokens it disagreed with most, for the trajectory page. Erased with its trajectory.
teacher_scores = sa.Table(
    "teacher_scores",
    metadata,
    sa.Column("call_id", sa.String(64), primary_key=True),
    sa.Column("choice", sa.Integer, primary_key=True),
    sa.Column("run", sa.String(200), primary_key=True),
    sa.Column("trajectory_id", sa.String(200), sa.ForeignKey("trajectories.id"), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("teacher", sa.String(300), nullable=False),
    sa.Column("kl", sa.Float, nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False),
    sa.Column("disagreements", Json, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Index("ix_teacher_scores_trajectory", "trajectory_id"),
)

# Feedback on trajectories from production users (records.Feedback); a trajectory may have many.
feedback = sa.Table(
    "feedback",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("trajectory_id", sa.String(200), sa.ForeignKey("trajectories.id"), nullable=False),
    sa.Column("score", sa.Float),
    sa.Column("thumbs", sa.String(8)),
    sa.Column("comment", sa.Text),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Index("ix_feedback_trajectory", "trajectory_id"),
)

# --- Erasure: what an erased subject's records meet when they arrive late (store/fences.py) ---

# One row per erased user, tenant and trajectory, keyed by a hash of it (never the id): a record
# of it whose call began before `fenced_before` is dropped on arrival (a call in flight during the
# erasure, another proxy's backlog). Kept: a record may arrive any time later.
erasure_fences = sa.Table(
    "erasure_fences",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("fenced_before", Timestamp, nullable=False),
    # The erasure that put it up: its fences are closed together, those the writer added too.
    sa.Column("erasure", sa.String(32), nullable=False),
    sa.Index("ix_erasure_fences_erasure", "erasure"),
)

# --- Evaluations: `art-proxy eval`'s reports (records.EvaluationReport), whole ---

evaluations = sa.Table(
    "evaluations",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("report", Json, nullable=False),
    sa.Index("ix_evaluations_created", "created_at"),
)
