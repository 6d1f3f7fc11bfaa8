"""Why a call is not trainable: its sampling could not be reproduced by the trainer (guided
decoding, penalties, min_p, logit_bias, min_tokens), or its ids and logprobs were incomplete.

Calls recorded before carry no reason (NULL).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("calls", sa.Column("untrainable_reason", sa.String(200)))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("untrainable_reason")
