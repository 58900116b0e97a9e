"""`step_verdicts` of every step, not only failed ones: whether it was slow and why (`slow`, `slow_cause`, `slow_s`,
`slow_share`), the KV record's facts (`cause`, `causes`), its latency's parts against its session's typical step, so
the pages read a slow cause decided once instead of attributing steps as they open. `failure_cause` and
`failure_kind` become nullable (a step that succeeded has none). Rows written before keep NULL in the new columns:
the pages read them as failed steps' verdicts, as before. An index on `decided_at`: the alerts read the steps decided
in their window.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 01:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

FLOATS = (
    "slow_s",
    "slow_share",
    "latency_s",
    "typical_s",
    "excess_s",
    "queue_s",
    "preempted_s",
    "prefill_s",
    "decode_s",
    "tool_s",
    "other_s",
    "lost_recompute_s",
    "invalidated_recompute_s",
    "routed_recompute_s",
)
COLUMNS: list[sa.Column] = [
    sa.Column("slow", sa.Boolean, nullable=True),
    sa.Column("slow_cause", sa.String(32), nullable=True),
    sa.Column("cause", sa.String(32), nullable=True),
    sa.Column("causes", sa.String(255), nullable=True),
    sa.Column("num_requests", sa.Integer, nullable=True),
]


def upgrade() -> None:
    with op.batch_alter_table("step_verdicts") as batch:
        batch.alter_column("failure_cause", existing_type=sa.String(32), nullable=True)
        batch.alter_column("failure_kind", existing_type=sa.String(16), nullable=True)
        for column in [*COLUMNS, *(sa.Column(name, sa.Float, nullable=True) for name in FLOATS)]:
            batch.add_column(column)
    op.create_index("ix_step_verdicts_decided_at", "step_verdicts", ["decided_at"])


def downgrade() -> None:
    op.drop_index("ix_step_verdicts_decided_at", table_name="step_verdicts")
    op.execute("DELETE FROM step_verdicts WHERE failure_cause IS NULL")  # the succeeded steps' rows
    with op.batch_alter_table("step_verdicts") as batch:
        for name in (*(c.name for c in COLUMNS), *FLOATS):
            batch.drop_column(name)
        batch.alter_column("failure_kind", existing_type=sa.String(16), nullable=False)
        batch.alter_column("failure_cause", existing_type=sa.String(32), nullable=False)
