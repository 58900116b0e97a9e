"""`request_lookups`: each request's prefix lookup as the collector measured it (routing loss, the shortfall's
parts), its per-minute rollup `lookup_minutes` (`kvobs.store.rollups.LOOKUP_MINUTES`), kept by the writer, and
how far each instance's lookups are measured (`lookup_progress`).
Nothing is filled: a lookup is measured from the fleet's KV events as they arrive, so rows stored before have none
(the pages replay those ranges, as before).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_BLOCKS = (
    "prompt_blocks",
    "own_blocks",
    "available_blocks",
    "best_blocks",
    "routed_blocks",
    "cold_blocks",
    "invalidated_blocks",
    "pause_blocks",
    "capacity_blocks",
    "unexplained_blocks",
)
_TOKENS = (
    "prompt_block_tokens",
    "achieved_tokens",
    "available_tokens",
    "routed_tokens",
    "cold_tokens",
    "invalidated_tokens",
    "pause_tokens",
    "capacity_tokens",
    "unexplained_tokens",
)


def upgrade() -> None:
    op.create_table(
        "request_lookups",
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("request_id", sa.String(length=255), nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=True),
        sa.Column("lookup_ts", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("block_size", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in _BLOCKS[:4]),
        sa.Column("best_instance", sa.String(length=255), nullable=True),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in _BLOCKS[4:]),
        sa.Column("replicas_compared", sa.Integer(), nullable=False),
        sa.Column("measured_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("instance", "request_id"),
    )
    op.create_index("ix_request_lookups_lookup_ts", "request_lookups", ["lookup_ts"])
    op.create_index("ix_request_lookups_session_id", "request_lookups", ["session_id"])
    op.create_table(
        "lookup_progress",
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("measured_to", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("instance"),
    )
    op.create_table(
        "lookup_minutes",
        sa.Column("minute", sa.Float(), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in _TOKENS),
        sa.Column("compared_requests", sa.BigInteger(), nullable=False),
        sa.Column("compared_prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("last_ts", sa.Float(), nullable=False),
        sa.Column("first_ts", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("minute", "instance"),
    )


def downgrade() -> None:
    op.drop_table("lookup_minutes")
    op.drop_table("lookup_progress")
    op.drop_index("ix_request_lookups_session_id", table_name="request_lookups")
    op.drop_index("ix_request_lookups_lookup_ts", table_name="request_lookups")
    op.drop_table("request_lookups")
