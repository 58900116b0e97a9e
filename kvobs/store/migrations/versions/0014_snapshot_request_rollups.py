"""Per-minute rollups of instance snapshots, requests and their latencies' sketches (`kvobs.store.rollups`), filled
from the rows already stored; from here on the writer keeps them in the transaction of the raw rows.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_CHUNK = 200_000  # rows read at a time while filling the rollups


def upgrade() -> None:
    op.create_table(
        "snapshot_minutes",
        *_keys(),
        *(sa.Column(n, sa.BigInteger(), nullable=False) for n in ("samples", "usage_n")),
        sa.Column("usage_sum", sa.Float(), nullable=False),
        sa.Column("resident_n", sa.BigInteger(), nullable=False),
        sa.Column("resident_sum", sa.Float(), nullable=False),
        sa.Column("waiting_n", sa.BigInteger(), nullable=False),
        sa.Column("waiting_sum", sa.Float(), nullable=False),
        sa.Column("counted", sa.BigInteger(), nullable=False),
        sa.Column("preemptions", sa.Float(), nullable=False),
        sa.Column("usage_max", sa.Float(), nullable=True),
        sa.Column("last_ts", sa.Float(), nullable=False),
        sa.Column("first_ts", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("minute", "instance"),
    )
    op.create_table(
        "request_minutes",
        *_keys(),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        *(
            sa.Column(f"{name}_{part}", sa.BigInteger() if part == "n" else sa.Float(), nullable=False)
            for name in ("ttft", "itl", "queue")
            for part in ("n", "sum")
        ),
        *(
            sa.Column(n, sa.BigInteger(), nullable=False)
            for n in ("cached_said", "hit_requests", "cached_tokens", "prompt_tokens")
        ),
        sa.Column("last_ts", sa.Float(), nullable=False),
        sa.Column("last_arrival_ts", sa.Float(), nullable=False),
        sa.Column("first_ts", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("minute", "instance"),
    )
    op.create_table(
        "latency_minutes",
        *_keys(),
        sa.Column("metric", sa.String(length=8), nullable=False),
        sa.Column("value_bin", sa.Integer(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("minute", "instance", "metric", "value_bin"),
    )
    _fill()


def _keys() -> list[sa.Column]:
    return [
        sa.Column("minute", sa.Float(), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
    ]


def _fill() -> None:
    """The rollups of the rows already stored, computed by the writer's own functions, a chunk of rows at a time."""
    import pandas as pd

    from kvobs.store.rollups import REQUEST_COLUMNS, SNAPSHOT_COLUMNS, stored_rollups
    from kvobs.store.sql.write import minute_rows

    conn = op.get_bind()
    snaps = pd.read_sql(
        f"SELECT {', '.join(SNAPSHOT_COLUMNS)} FROM snapshots WHERE session_id IS NULL ORDER BY ts, id",
        conn,
        chunksize=_CHUNK,
    )
    reqs = pd.read_sql(f"SELECT {', '.join(REQUEST_COLUMNS)} FROM requests ORDER BY arrival_ts", conn, chunksize=_CHUNK)
    for rollup, merged in stored_rollups(snaps, reqs):
        rows = [dict(zip(rollup.columns, row)) for row in minute_rows(merged, rollup.columns)]
        if rows:
            op.bulk_insert(sa.table(rollup.table, *(sa.column(c) for c in rollup.columns)), rows)


def downgrade() -> None:
    for table in ("latency_minutes", "request_minutes", "snapshot_minutes"):
        op.drop_table(table)
