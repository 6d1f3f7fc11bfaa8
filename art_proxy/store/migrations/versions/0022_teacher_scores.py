"""Teacher scores: a teacher's mean KL on each trained choice and the tokens it disagreed with
most (on-policy distillation), for the trajectory page; erased with their trajectory.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teacher_scores",
        sa.Column("call_id", sa.String(64), primary_key=True),
        sa.Column("choice", sa.Integer, primary_key=True),
        sa.Column("run", sa.String(200), primary_key=True),
        sa.Column(
            "trajectory_id", sa.String(200), sa.ForeignKey("trajectories.id"), nullable=False
        ),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("teacher", sa.String(300), nullable=False),
        sa.Column("kl", sa.Float, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("disagreements", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_teacher_scores_trajectory", "teacher_scores", ["trajectory_id"])


def downgrade() -> None:
    op.drop_index("ix_teacher_scores_trajectory", "teacher_scores")
    op.drop_table("teacher_scores")
