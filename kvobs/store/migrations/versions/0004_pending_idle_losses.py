"""Snapshots say how many of a session's idle losses are still pending (a tool pause or the session's end, not yet
known): `snapshots.session_pending_idle_blocks`. `session_evicted_idle_blocks` counts settled tool-pause losses only.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("snapshots", sa.Column("session_pending_idle_blocks", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("snapshots", "session_pending_idle_blocks")
