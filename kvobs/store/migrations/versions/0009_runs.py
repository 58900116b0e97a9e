"""`runs`: each engine run (a start with an empty cache), so pages, what-if and hit rates never treat two runs of
one instance as one.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(length=255), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=True),
        sa.Column("num_blocks", sa.Integer(), nullable=True),
        sa.Column("block_size", sa.Integer(), nullable=True),
        sa.Column("eviction_policy", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_index("ix_runs_instance_started_at", "runs", ["instance", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_instance_started_at", table_name="runs")
    op.drop_table("runs")
