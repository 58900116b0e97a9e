"""Indexes the read queries need (dashboard, analytics, alerts): KV events by time and by kind over time,
steps by start time.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 12:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_kv_events_ts", "kv_events", ["ts"])
    op.create_index("ix_kv_events_kind_ts", "kv_events", ["kind", "ts"])
    op.create_index("ix_steps_started_at", "steps", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_steps_started_at", "steps")
    op.drop_index("ix_kv_events_kind_ts", "kv_events")
    op.drop_index("ix_kv_events_ts", "kv_events")
