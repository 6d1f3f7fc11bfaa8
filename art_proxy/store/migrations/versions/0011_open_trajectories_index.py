"""Open trajectories indexed by their last call in a partial index, instead of every trajectory by
(status, updated_at). Without statistics (SQLite's, until an ANALYZE nobody runs) the planner took
that index for any `status = ?`: the trainer's query for the members of a few groups, and a list of
one group's trajectories by status, read every finished trajectory through it. Housekeeping's two
queries, the index's reason, say `status = 'open'` in their text and use the partial one.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_trajectories_status_updated", table_name="trajectories")
    op.create_index(
        "ix_trajectories_open_updated",
        "trajectories",
        ["updated_at"],
        sqlite_where=sa.text("status = 'open'"),
        postgresql_where=sa.text("status = 'open'"),
    )


def downgrade() -> None:
    op.drop_index("ix_trajectories_open_updated", table_name="trajectories")
    op.create_index("ix_trajectories_status_updated", "trajectories", ["status", "updated_at"])
