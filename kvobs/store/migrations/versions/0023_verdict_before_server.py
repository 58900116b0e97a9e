"""`step_verdicts.before_s`: the time from a step's start to its first request's arrival at the server (the agent's
own queue, the network, the server's accept queue), a part of its own, no longer inside `other_s`. Rows decided
before keep NULL: their `other_s` holds it.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04 04:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("step_verdicts") as batch:
        batch.add_column(sa.Column("before_s", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_verdicts") as batch:
        batch.drop_column("before_s")
