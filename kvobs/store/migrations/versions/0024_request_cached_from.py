"""`requests.cached_from`: where a request's cached tokens came from, the server's own record or the reply's usage
as the joined step recorded it (`kvobs.semconv.spans.CachedFrom`). Rows stored before keep NULL: their counts were
the server's own.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("cached_from", sa.String(8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("cached_from")
