"""Sums-only rollups: `kv_events.first_owner` (1 on one row per block event, so "blocks" is a sum) and
`kv_event_minutes` (events and blocks per minute, instance, kind and reason), both filled from the rows already
stored; from here on the writer keeps the rollup in the transaction of the raw rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kv_events", sa.Column("first_owner", sa.SmallInteger(), nullable=True))
    op.execute("""UPDATE kv_events SET first_owner = CASE WHEN id IN (SELECT min(id) FROM kv_events
                  WHERE block_hash IS NOT NULL GROUP BY instance, ts, block_hash, kind, reason) THEN 1 ELSE 0 END
                  WHERE block_hash IS NOT NULL""")
    op.create_table(
        "kv_event_minutes",
        sa.Column("minute", sa.Float(), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("blocks", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("minute", "instance", "kind", "reason"),
    )
    op.execute("""INSERT INTO kv_event_minutes (minute, instance, kind, reason, events, blocks)
                  SELECT floor(ts / 60) * 60, instance, kind, coalesce(reason, ''), count(*),
                         coalesce(sum(first_owner), 0) FROM kv_events
                  GROUP BY floor(ts / 60) * 60, instance, kind, coalesce(reason, '')""")


def downgrade() -> None:
    op.drop_table("kv_event_minutes")
    op.drop_column("kv_events", "first_owner")
