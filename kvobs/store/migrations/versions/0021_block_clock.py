"""`kv_events.lifetime_s`, `restored` and `restored_after_s`: what a block's loss and its store back are known as the
rows are made (`kvobs.block_clock`), so no read looks a block up by its hash; SQLite's block-hash index goes, since
no read needs it there any more. Rows written before stay NULL: the lifetime and restore reads leave them out (not
measured), they are not guessed from the hashes.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("kv_events") as batch:
        batch.add_column(sa.Column("lifetime_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("restored", sa.SmallInteger(), nullable=True))
        batch.add_column(sa.Column("restored_after_s", sa.Float(), nullable=True))
    op.drop_index("ix_kv_events_block_hash", table_name="kv_events")


def downgrade() -> None:
    op.create_index("ix_kv_events_block_hash", "kv_events", ["block_hash"])
    with op.batch_alter_table("kv_events") as batch:
        batch.drop_column("restored_after_s")
        batch.drop_column("restored")
        batch.drop_column("lifetime_s")
