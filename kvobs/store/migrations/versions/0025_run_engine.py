"""`runs.engine`: the engine a run was of (`kvobs.semconv.spans.RunEngine`: kvobs serve or vLLM), as its /metrics
or the engine itself says; the what-if replays a run by its engine's block rules. Rows stored before keep NULL.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("engine", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("engine")
