"""`kv_events.shared_start_tokens`: on a chain's first stored block, the tokens it began with as an earlier chain's
first block did, less than a block (a shared prefix shorter than a block: computed again by each, never found
cached; `collectors.kv.shared_starts`). Rows stored before keep NULL (not compared).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-04 15:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("kv_events") as batch:
        batch.add_column(sa.Column("shared_start_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kv_events") as batch:
        batch.drop_column("shared_start_tokens")
