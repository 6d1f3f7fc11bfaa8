"""A training step's kind: grpo (on scored groups) or sft (a warm start on demonstrations).

Existing steps are all GRPO steps: warm starts did not exist before this revision.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "training_steps",
        sa.Column("kind", sa.String(8), nullable=False, server_default="grpo"),
    )


def downgrade() -> None:
    with op.batch_alter_table("training_steps") as batch:
        batch.drop_column("kind")
