"""A trajectory's calls have one seq each: `(trajectory_id, seq)` is unique.

A proxy restarted with its journal not yet ingested once numbered a trajectory's next call 0 again
(fixed since: the adopted journal is ingested before the first call is answered), and nothing in
the store stopped it; a trajectory with two calls at one seq trains on a conversation that never
happened. Stores that have such calls keep them all: each affected trajectory's calls are
renumbered 0..n-1 in the order they were recorded (time, then seq, then id: the calls a
restarted proxy numbered from 0 again come after those of the run before it), then the index that
orders them becomes unique.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_CLASHING = "SELECT trajectory_id FROM calls GROUP BY trajectory_id, seq HAVING COUNT(*) > 1"


def upgrade() -> None:
    connection = op.get_bind()
    # Read first, then write: an UPDATE ranking the rows it changes would see its own writes.
    calls = connection.execute(
        sa.text(
            f"SELECT id, trajectory_id FROM calls WHERE trajectory_id IN ({_CLASHING}) "
            "ORDER BY trajectory_id, created_at, seq, id"
        )
    ).all()
    renumbered: list[dict[str, object]] = []
    seqs: dict[str, int] = {}
    for call_id, trajectory_id in calls:
        seq = seqs[trajectory_id] = seqs.get(trajectory_id, -1) + 1
        renumbered.append({"id": call_id, "seq": seq})
    if renumbered:
        connection.execute(sa.text("UPDATE calls SET seq = :seq WHERE id = :id"), renumbered)
    op.drop_index("ix_calls_trajectory_seq", table_name="calls")
    op.create_index("ix_calls_trajectory_seq", "calls", ["trajectory_id", "seq"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_calls_trajectory_seq", table_name="calls")
    op.create_index("ix_calls_trajectory_seq", "calls", ["trajectory_id", "seq"])
