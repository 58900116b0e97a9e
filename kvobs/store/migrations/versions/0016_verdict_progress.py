"""`verdict_progress`: each verdict keeper's latest run (`collectors.jobs.step_verdicts`), so a page can tell a failed
step whose verdict a running collector will decide (pending) from one nobody will decide (worked out as it opens).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "verdict_progress",
        sa.Column("keeper", sa.String(length=255), nullable=False),
        sa.Column("covers_from", sa.Float(), nullable=False),
        sa.Column("read_to", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("keeper"),
    )


def downgrade() -> None:
    op.drop_table("verdict_progress")
