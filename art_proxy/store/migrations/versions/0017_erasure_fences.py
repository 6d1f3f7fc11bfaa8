"""Erasure fences: records of an erased subject that arrive after its erasure are dropped.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "erasure_fences",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("fenced_before", sa.DateTime(timezone=True), nullable=False),
        sa.Column("erasure", sa.String(32), nullable=False),
    )
    op.create_index("ix_erasure_fences_erasure", "erasure_fences", ["erasure"])


def downgrade() -> None:
    op.drop_table("erasure_fences")
