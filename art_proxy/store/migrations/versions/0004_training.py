"""Training: model aliases and their moves, trainer steps, and the groups each run consumed.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Frozen copies of the column types of this revision: a migration must not follow later schema edits.
Json = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "aliases",
        sa.Column("alias", sa.String(200), primary_key=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("step", sa.Integer),
        sa.Column("updated_at", Timestamp, nullable=False),
    )
    op.create_table(
        "alias_moves",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("alias", sa.String(200), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("previous", sa.String(200)),
        sa.Column("step", sa.Integer),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("moved_at", Timestamp, nullable=False),
    )
    op.create_index("ix_alias_moves_alias_moved", "alias_moves", ["alias", "moved_at"])
    op.create_table(
        "training_steps",
        sa.Column("run", sa.String(200), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("adapter", sa.String(200)),
        sa.Column("swap", sa.String(16)),
        sa.Column("swap_error", sa.Text),
        sa.Column("groups", Json, nullable=False),
        sa.Column("metrics", Json, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
    )
    op.create_table(
        "consumed_groups",
        sa.Column("run", sa.String(200), primary_key=True),
        sa.Column("group_id", sa.String(64), sa.ForeignKey("groups.id"), primary_key=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("consumed_at", Timestamp, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("consumed_groups")
    op.drop_table("training_steps")
    op.drop_index("ix_alias_moves_alias_moved", "alias_moves")
    op.drop_table("alias_moves")
    op.drop_table("aliases")
