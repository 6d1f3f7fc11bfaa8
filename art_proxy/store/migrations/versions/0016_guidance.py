"""Guided retries: the guidance a call was sampled with, and where its tokens sit in the prompt.

Calls recorded before this revision carry none (NULL).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("calls", sa.Column("guidance", sa.JSON().with_variant(JSONB(), "postgresql")))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("guidance")
