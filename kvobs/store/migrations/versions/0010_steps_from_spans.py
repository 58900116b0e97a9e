"""`steps.response_id` and `steps.tools`, for steps made from agent frameworks' spans: the id the server answered
(the step's request when no trace context reached the server) and the tool calls in the pause before the step
(JSON). NULL on the SDK's steps and on rows written before this revision.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("response_id", sa.String(255), nullable=True))
    op.add_column("steps", sa.Column("tools", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("tools")
        batch.drop_column("response_id")
