"""`sessions.parent_session_id`: the session that started this one, where the request said so (a coding agent's
subagent: Claude Code's parent agent id, OpenCode's `x-parent-session-id`; `kvobs.semconv.sessions`). Rows stored
before keep NULL (not said).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04 18:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("parent_session_id", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("parent_session_id")
