"""`kv_events.num_blocks`: how many blocks an event without a block hash covers (a prefix hit, an allocation, a
preemption, a reset), so a hit of 10 blocks is not counted as one. NULL on a block's own row (one block) and on
rows written before this revision (unknown).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kv_events", sa.Column("num_blocks", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kv_events") as batch:
        batch.drop_column("num_blocks")
