"""Canary looks: a running canary's evidence at each look of its decider (both arms' live
rewards, the interval on their difference, the verdict), for the dashboard and /metrics; and the
share each canary move set (a canary's stages, its evidence stratified by them).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "canary_looks",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("alias", sa.String(200), nullable=False),
        sa.Column("looked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fraction", sa.Float, nullable=False),
        sa.Column("candidate", Json, nullable=False),
        sa.Column("target", Json, nullable=False),
        sa.Column("difference", sa.Float, nullable=False),
        sa.Column("low", sa.Float),
        sa.Column("high", sa.Float),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("note", sa.String(500), nullable=False),
    )
    op.create_index("ix_canary_looks_alias_looked", "canary_looks", ["alias", "looked_at"])
    op.add_column("alias_moves", sa.Column("fraction", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("alias_moves") as batch:
        batch.drop_column("fraction")
    op.drop_index("ix_canary_looks_alias_looked", "canary_looks")
    op.drop_table("canary_looks")
