"""Calls in the Responses and Anthropic Messages dialects: which API the client spoke, and the body
it sent in that API (the `request` column keeps the chat-completions body the proxy sent upstream,
which is what stitching, the judge and the trainer read). And the key of a trajectory's latest
answered call's messages without its reply, by which any proxy recognises an agent that sends the
reply back re-rendered.

Calls recorded before were all OpenAI chat or legacy completions calls: `openai`, no client body;
trajectories recorded before have no prompt key (their next call is matched exactly only).

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
    op.add_column("trajectories", sa.Column("tip_prompt_key", sa.String(64)))
    op.create_index("ix_trajectories_tip_prompt_key", "trajectories", ["tip_prompt_key"])


def downgrade() -> None:
    op.drop_index("ix_trajectories_tip_prompt_key", "trajectories")
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("tip_prompt_key")
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("client_request")
        batch.drop_column("dialect")
