"""Block hashes as 8-byte integers on SQLite: `kv_events.block_hash` and `parent_hash` were the decimal text of
the unsigned value (up to 20 characters, twice per row, and a text index); they become the signed 64-bit integer
with the same bits (`kvobs.store.uint64.as_int64`), which SQLite stores in at most 8 bytes and compares as
integers. PostgreSQL keeps NUMERIC(20).

The table is rebuilt (SQLite cannot change a column's type): each value is first rewritten as the text of its
signed form, so the rebuild's CAST to INTEGER is exact (a CAST of a text over 2^63 would saturate).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TWO_64 = 2**64
_TEXT = sa.String(20)


def _signed_text(value):
    if value is None:
        return None
    number = int(value)
    return str(number - TWO_64 if number >= 2**63 else number)


def _unsigned_text(value):
    if value is None:
        return None
    number = int(value)
    return str(number + TWO_64 if number < 0 else number)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rewrite(_signed_text)  # still text: '18446744073709551615' -> '-1'
        _retype(sa.BigInteger(), _TEXT)  # CAST('-1' AS BIGINT): exact


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _retype(_TEXT, sa.BigInteger())  # CAST(-1 AS VARCHAR): '-1', exact
        _rewrite(_unsigned_text)  # '-1' -> '18446744073709551615' (a text column keeps it as text)


def _rewrite(function) -> None:
    connection = op.get_bind().connection.driver_connection
    assert connection is not None  # SQLite only: the sqlite3 connection under SQLAlchemy's
    connection.create_function("kvobs_hash_text", 1, function, deterministic=True)
    op.execute(
        "UPDATE kv_events SET block_hash = kvobs_hash_text(block_hash), parent_hash = "
        "kvobs_hash_text(parent_hash) WHERE block_hash IS NOT NULL OR parent_hash IS NOT NULL"
    )


def _retype(new_type, old_type) -> None:
    with op.batch_alter_table("kv_events", recreate="always") as batch:
        batch.alter_column("block_hash", type_=new_type, existing_type=old_type, existing_nullable=True)
        batch.alter_column("parent_hash", type_=new_type, existing_type=old_type, existing_nullable=True)
