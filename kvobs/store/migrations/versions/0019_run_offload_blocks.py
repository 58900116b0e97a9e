"""`runs.offload_blocks`: the blocks of the offload tier below the run's cache (vLLM's `--kv-offloading-size`; 0:
none; NULL: not said), so a replay of the run reproduces it with its tier. Rows written before keep NULL.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 08:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("offload_blocks", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("offload_blocks")
