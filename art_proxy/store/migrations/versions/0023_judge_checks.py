"""Judge checks: what `art-proxy judge --check` found of a judge and rubric, so that a trainer
refuses the judgments of one whose newest check failed.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "judge_checks",
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
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_judge_checks_judge", "judge_checks", ["judge_model", "rubric_hash", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_judge_checks_judge", "judge_checks")
    op.drop_table("judge_checks")
