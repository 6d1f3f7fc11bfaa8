"""Whose trajectory it is: a user and a tenant on each trajectory, indexed.

`art-proxy forget --user/--tenant` erases by them and lists filter by them; trajectories recorded
before this revision belong to no one (NULL).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_SUBJECTS = (("user_id", "ix_trajectories_user"), ("tenant_id", "ix_trajectories_tenant"))


def upgrade() -> None:
    for column, index in _SUBJECTS:
        op.add_column("trajectories", sa.Column(column, sa.String(200)))
        op.create_index(index, "trajectories", [column, "created_at"])


def downgrade() -> None:
    for column, index in _SUBJECTS:
        op.drop_index(index, table_name="trajectories")
        with op.batch_alter_table("trajectories") as batch:
            batch.drop_column(column)
