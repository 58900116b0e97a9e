"""`kv_events.group_idx`, `kv_cache_spec_kind`, `lora_name`, `extra_keys`: what vLLM's BlockStored and BlockRemoved
say of a block beyond its hash (a hybrid model's KV-cache group and its kind, the LoRA adapter, the extra hash keys).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

COLUMNS = (
    ("group_idx", sa.SmallInteger()),
    ("kv_cache_spec_kind", sa.String(length=255)),
    ("lora_name", sa.String(length=255)),
    ("extra_keys", sa.Text()),
)


def upgrade() -> None:
    for name, type_ in COLUMNS:  # ADD COLUMN on every backend: no table rewrite (a batch would copy every row)
        op.add_column("kv_events", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kv_events") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
