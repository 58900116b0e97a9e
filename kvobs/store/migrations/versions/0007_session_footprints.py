"""`session_footprints`: each session's latest footprint on each instance (a rollup of `snapshots`' session rows,
kept by the writer from here on), filled from the snapshots already stored.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COUNTS = (
    "blocks_total",
    "blocks_free",
    "blocks_resident",
    "session_blocks",
    "session_evicted_blocks",
    "session_evicted_idle_blocks",
    "session_pending_idle_blocks",
    "session_hit_tokens",
)
_COLUMNS = (
    "ts",
    "instance",
    "session_id",
    "kv_usage",
    *_COUNTS,
    "hit_rate",
    "num_running",
    "num_waiting",
    "preemptions_total",
    "evictions_total",
)


def upgrade() -> None:
    op.create_table(
        "session_footprints",
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("kv_usage", sa.Float(), nullable=True),
        *(sa.Column(name, sa.Integer(), nullable=True) for name in _COUNTS),
        sa.Column("hit_rate", sa.Float(), nullable=True),
        *(
            sa.Column(name, sa.Integer(), nullable=True)
            for name in ("num_running", "num_waiting", "preemptions_total", "evictions_total")
        ),
        sa.PrimaryKeyConstraint("session_id", "instance"),
    )
    op.create_index("ix_session_footprints_ts", "session_footprints", ["ts"])
    columns = ", ".join(_COLUMNS)
    op.execute(f"""INSERT INTO session_footprints ({columns}) SELECT {columns} FROM (
                   SELECT *, row_number() OVER (PARTITION BY session_id, instance ORDER BY ts DESC, id DESC) AS latest
                   FROM snapshots WHERE session_id IS NOT NULL) AS ranked WHERE latest = 1""")


def downgrade() -> None:
    op.drop_index("ix_session_footprints_ts", table_name="session_footprints")
    op.drop_table("session_footprints")
