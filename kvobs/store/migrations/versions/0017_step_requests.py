"""`steps.request_id` and `steps.request_join`: the server request a step made of an agent's spans was joined to by
the collector (`collectors/traces/request_join.py`), and how (an id in its reply, its trace, its timing) or why none
was.
NULL on the SDK's steps and on rows written before this revision (those are joined by `response_id` as before).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("request_id", sa.String(255), nullable=True))
    op.add_column("steps", sa.Column("request_join", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("request_join")
        batch.drop_column("request_id")
