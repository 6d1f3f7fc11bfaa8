"""Evaluations: the reports of `art-proxy eval`, which the dashboard lists.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("report", Json, nullable=False),
    )
    op.create_index("ix_evaluations_created", "evaluations", ["created_at"])


def downgrade() -> None:
    op.drop_table("evaluations")
