"""Scenarios, groups, trajectories and calls.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copies of the column types of this revision: a migration must not follow later schema edits.
Json = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "scenarios",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("auto", sa.Boolean, nullable=False),
        sa.Column("opening", Json, nullable=False),
    )
    op.create_table(
        "groups",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("scenario_id", sa.String(200), sa.ForeignKey("scenarios.id"), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
    )
    op.create_index("ix_groups_scenario_created", "groups", ["scenario_id", "created_at"])
    op.create_table(
        "trajectories",
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
        sa.Column("tip_key", sa.String(64)),
    )
    op.create_index("ix_trajectories_group", "trajectories", ["group_id"])
    op.create_index("ix_trajectories_scenario_status", "trajectories", ["scenario_id", "status"])
    op.create_index("ix_trajectories_status_updated", "trajectories", ["status", "updated_at"])
    op.create_index("ix_trajectories_tip_key", "trajectories", ["tip_key"])
    op.create_table(
        "calls",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column(
            "trajectory_id", sa.String(200), sa.ForeignKey("trajectories.id"), nullable=False
        ),
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
        sa.Column("stitched", sa.Boolean, nullable=False),
        sa.Column("attribution", sa.String(16), nullable=False),
        sa.Column("continuation_key", sa.String(64)),
    )
    op.create_index("ix_calls_trajectory_seq", "calls", ["trajectory_id", "seq"])
    op.create_index("ix_calls_continuation_key", "calls", ["continuation_key"])


def downgrade() -> None:
    op.drop_table("calls")
    op.drop_table("trajectories")
    op.drop_table("groups")
    op.drop_table("scenarios")
