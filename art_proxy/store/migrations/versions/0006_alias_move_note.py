"""Safe promotion: the evidence for an alias move, and what promotion did at a training step.

Existing moves and steps carry no note (NULL): they were made before promotion existed.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("alias_moves", sa.Column("note", sa.String(500)))
    op.add_column("training_steps", sa.Column("promotion", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("training_steps") as batch:
        batch.drop_column("promotion")
    with op.batch_alter_table("alias_moves") as batch:
        batch.drop_column("note")
