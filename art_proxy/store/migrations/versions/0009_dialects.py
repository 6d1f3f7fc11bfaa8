"""Calls in the Responses and Anthropic Messages dialects: which API the client spoke, and the body
it sent in that API (the `request` column keeps the chat-completions body the proxy sent upstream,
which is what stitching, the judge and the trainer read).

Calls recorded before were all OpenAI chat or legacy completions calls: `openai`, no client body.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "calls", sa.Column("dialect", sa.String(16), nullable=False, server_default="openai")
    )
    op.add_column(
        "calls", sa.Column("client_request", sa.JSON().with_variant(JSONB(), "postgresql"))
    )


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("client_request")
        batch.drop_column("dialect")
