"""Proxy leases: the models each proxy's open trajectories hold in its memory, published so the
trainer sees a lease before its first call is recorded (proxy/lease_publisher.py).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "proxy_leases",
        sa.Column("proxy_id", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("trajectories", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("proxy_leases")
