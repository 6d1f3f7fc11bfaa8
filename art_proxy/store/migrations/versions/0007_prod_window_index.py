"""Safe promotion's rollback watch reads the finished `prod` trajectories of a time window on every
poll of the sidecar; without this index that is a scan of every trajectory ever recorded.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_trajectories_split_status_created", "trajectories", ["split", "status", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_trajectories_split_status_created", table_name="trajectories")
