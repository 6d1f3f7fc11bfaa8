"""Judgments of ensembles and hybrid rewards: members, their rank agreement, the reward rule.

Existing judgments were made by one judge with the RULER score as the reward: no members, and
reward rule `ruler`. An ensemble's name lists every judge, so the judge column grows (PostgreSQL
enforces the length; SQLite does not, so it is left alone there).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Frozen copy of the column type of this revision: a migration must not follow later schema edits.
Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("judgments", sa.Column("members", Json))
    op.add_column("judgments", sa.Column("rank_agreement", sa.Float))
    op.add_column(
        "judgments",
        sa.Column("reward_rule", sa.String(200), nullable=False, server_default="ruler"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "judgments", "judge_model", type_=sa.String(1000), existing_type=sa.String(200)
        )


def downgrade() -> None:
    with op.batch_alter_table("judgments") as batch:
        batch.drop_column("reward_rule")
        batch.drop_column("rank_agreement")
        batch.drop_column("members")
        batch.alter_column("judge_model", type_=sa.String(200), existing_type=sa.String(1000))
