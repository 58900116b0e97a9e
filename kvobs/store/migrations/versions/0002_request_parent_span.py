"""requests.parent_span_id: the span that sent the request (the agent step's `chat` or step span), so a request
joins its exact step, not only its trace.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 10:05:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("parent_span_id", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("parent_span_id")
