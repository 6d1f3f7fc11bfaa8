"""Judgments in several orders: how much the orders' scores agree (position debiasing).

Judgments recorded before this revision were made in one order (NULL).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("judgments", sa.Column("order_agreement", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("judgments") as batch:
        batch.drop_column("order_agreement")
