"""`connector_lookups`: a request's lookup in a KV connector's own cache as the connector's spans said it (LMCache's
per-request span: tokens asked for and found by its levels, the time its lookup, loads and stores took). Nothing to
fill: rows come as the connector's spans arrive.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-05 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

ID = 255  # the store's id columns (`kvobs.semconv.limits.MAX_ID_BYTES` when this revision was written)

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "connector_lookups",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("request_id", sa.String(ID), nullable=False),
        sa.Column("instance", sa.String(ID), nullable=False),
        sa.Column("connector", sa.String(32), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("requested_tokens", sa.Integer(), nullable=True),
        sa.Column("hit_tokens", sa.Integer(), nullable=True),
        sa.Column("l1_hit_tokens", sa.Integer(), nullable=True),
        sa.Column("l2_hit_tokens", sa.Integer(), nullable=True),
        sa.Column("early_exit_reason", sa.String(ID), nullable=True),
        sa.Column("lookup_s", sa.Float(), nullable=True),
        sa.Column("retrieve_s", sa.Float(), nullable=True),
        sa.Column("store_s", sa.Float(), nullable=True),
        sa.Column("num_retrieves", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("num_stores", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("trace_id", sa.String(32), nullable=True),
        sa.Column("span_id", sa.String(16), nullable=True),
    )
    op.create_index("ix_connector_lookups_started_at", "connector_lookups", ["started_at"])
    op.create_index("ix_connector_lookups_request_id", "connector_lookups", ["request_id"])


def downgrade() -> None:
    op.drop_table("connector_lookups")
