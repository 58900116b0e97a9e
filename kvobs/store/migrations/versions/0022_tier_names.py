"""`kv_events.medium` holds up to 64 characters: a tier's name can be longer than 16 (a REMOTE shared storage tier,
`REMOTE_SHARED_STORAGE`; a secondary tier that names itself, `CPU/kvcr`), which PostgreSQL refused. SQLite copies the
table once to change the declared type (it never enforced the length).

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 10:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("kv_events") as batch:
        batch.alter_column("medium", existing_type=sa.String(16), type_=sa.String(64), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("kv_events") as batch:
        batch.alter_column("medium", existing_type=sa.String(64), type_=sa.String(16), existing_nullable=True)
