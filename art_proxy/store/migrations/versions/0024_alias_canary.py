"""Alias canaries: a candidate serving a share of an alias's new trajectories beside its target.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("aliases", sa.Column("canary", sa.String(200)))
    op.add_column(
        "aliases", sa.Column("canary_fraction", sa.Float, nullable=False, server_default="0")
    )
    op.add_column("aliases", sa.Column("canary_since", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("aliases") as batch:
        batch.drop_column("canary_since")
        batch.drop_column("canary_fraction")
        batch.drop_column("canary")
