"""`request_lookups.tier_blocks` and `lookup_minutes.tier_tokens`: of a lookup's hit, the blocks its replica held only
in a lower tier (loaded from an offload tier, not found in the cache). Rows measured before count 0: their lookups
did not tell the tiers apart (their hits are all in `own_blocks`, as before).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("request_lookups") as batch:
        batch.add_column(sa.Column("tier_blocks", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("lookup_minutes") as batch:
        batch.add_column(sa.Column("tier_tokens", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("lookup_minutes") as batch:
        batch.drop_column("tier_tokens")
    with op.batch_alter_table("request_lookups") as batch:
        batch.drop_column("tier_blocks")
