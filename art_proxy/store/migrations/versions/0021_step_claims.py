"""Step claims: the groups a training step is training on now, claimed before it reads their calls,
so that an erasure meanwhile names the step in its lineage (store/training.py `claim_step`).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_claims",
        sa.Column("run", sa.String(200), primary_key=True),
        sa.Column("group_id", sa.String(64), primary_key=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("step_claims")
