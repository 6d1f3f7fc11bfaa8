"""Feedback: users' scores, thumbs and comments on trajectories.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# A frozen copy of the column type of this revision: a migration must not follow later schema edits.
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "feedback",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column(
            "trajectory_id", sa.String(200), sa.ForeignKey("trajectories.id"), nullable=False
        ),
        sa.Column("score", sa.Float),
        sa.Column("thumbs", sa.String(8)),
        sa.Column("comment", sa.Text),
        sa.Column("created_at", Timestamp, nullable=False),
    )
    op.create_index("ix_feedback_trajectory", "feedback", ["trajectory_id"])


def downgrade() -> None:
    op.drop_index("ix_feedback_trajectory", "feedback")
    op.drop_table("feedback")
