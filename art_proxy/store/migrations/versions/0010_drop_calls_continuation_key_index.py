"""No query looks a call up by its continuation key: stitching finds open trajectories by their
tip's key (`ix_trajectories_tip_key`) and joins their calls by trajectory. The index only cost
every recorded call an entry on a random page of it (the key is a hash), which the commit then
wrote to SQLite's WAL.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_calls_continuation_key", table_name="calls")


def downgrade() -> None:
    op.create_index("ix_calls_continuation_key", "calls", ["continuation_key"])
