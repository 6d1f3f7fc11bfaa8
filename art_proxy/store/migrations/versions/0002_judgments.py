"""Judgments: RULER's verdict on a group.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Frozen copies of the column types of this revision: a migration must not follow later schema edits.
Json = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "judgments",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("group_id", sa.String(64), sa.ForeignKey("groups.id"), nullable=False),
        sa.Column("judge_model", sa.String(200), nullable=False),
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
    )
    op.create_index(
        "ix_judgments_group_judge", "judgments", ["group_id", "judge_model", "rubric_hash"]
    )
    op.create_index("ix_judgments_cache_key", "judgments", ["cache_key"])


def downgrade() -> None:
    op.drop_table("judgments")
