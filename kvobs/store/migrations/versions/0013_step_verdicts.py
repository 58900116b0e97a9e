"""`step_verdicts`: each failed step's verdict, written once its session settled, so the Overview's failure table
reads verdicts instead of attributing every step of its range again.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_verdicts",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=8), nullable=False),
        sa.Column("error_type", sa.String(length=255), nullable=True),
        sa.Column("trace_id", sa.String(length=32), nullable=True),
        sa.Column("span_id", sa.String(length=16), nullable=True),
        sa.Column("failure_cause", sa.String(length=32), nullable=False),
        sa.Column("failure_kind", sa.String(length=16), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=True),
        sa.Column("decided_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "step_index"),
    )
    op.create_index("ix_step_verdicts_started_at", "step_verdicts", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_step_verdicts_started_at", table_name="step_verdicts")
    op.drop_table("step_verdicts")
