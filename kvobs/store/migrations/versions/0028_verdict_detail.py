"""`step_verdicts.detail`: the attribution's other columns of a decided step, as JSON (its facts' counts, its typical
parts, its excess by part, its replica), so a settled session's page reads its steps whole and attributes nothing.
Rows decided before keep NULL: the page attributes their session as it did.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-04 22:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("step_verdicts") as batch:
        batch.add_column(sa.Column("detail", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_verdicts") as batch:
        batch.drop_column("detail")
