"""The initial schema: sessions, steps, requests, kv_events, snapshots, metric_samples, alerts.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 08:15:35.352133
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Block hashes as this revision created them (0006 made them 8-byte integers on SQLite).
_UINT64_TEXT = sa.String(20).with_variant(sa.Numeric(20, 0), "postgresql")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("rule", sa.String(length=255), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=True),
        sa.Column("session_id", sa.String(length=255), nullable=True),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("summary", sa.String(length=1024), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index("ix_alerts_rule_ts", ["rule", "ts"], unique=False)
        batch_op.create_index("ix_alerts_ts", ["ts"], unique=False)

    op.create_table(
        "kv_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("block_hash", _UINT64_TEXT, nullable=True),
        sa.Column("parent_hash", _UINT64_TEXT, nullable=True),
        sa.Column("num_tokens", sa.Integer(), nullable=True),
        sa.Column("session_id", sa.String(length=255), nullable=True),
        sa.Column("request_id", sa.String(length=255), nullable=True),
        sa.Column("reason", sa.String(length=32), nullable=True),
        sa.Column("medium", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("kv_events", schema=None) as batch_op:
        batch_op.create_index("ix_kv_events_block_hash", ["block_hash"], unique=False)
        batch_op.create_index("ix_kv_events_instance_ts", ["instance", "ts"], unique=False)
        batch_op.create_index("ix_kv_events_session_ts", ["session_id", "ts"], unique=False)

    op.create_table(
        "metric_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("metric_samples", schema=None) as batch_op:
        batch_op.create_index("ix_metric_samples_instance_ts", ["instance", "ts"], unique=False)
        batch_op.create_index("ix_metric_samples_name_ts", ["name", "ts"], unique=False)

    op.create_table(
        "requests",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("request_id", sa.String(length=255), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=True),
        sa.Column("trace_id", sa.String(length=32), nullable=True),
        sa.Column("span_id", sa.String(length=16), nullable=True),
        sa.Column("arrival_ts", sa.Float(), nullable=False),
        sa.Column("first_token_ts", sa.Float(), nullable=True),
        sa.Column("finished_ts", sa.Float(), nullable=True),
        sa.Column("queue_s", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("num_preemptions", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("instance", "request_id"),
    )
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.create_index("ix_requests_arrival_ts", ["arrival_ts"], unique=False)
        batch_op.create_index("ix_requests_session_id", ["session_id"], unique=False)
        batch_op.create_index("ix_requests_trace_id", ["trace_id"], unique=False)

    op.create_table(
        "sessions",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("agent_name", sa.String(length=255), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("num_steps", sa.Integer(), nullable=False),
        sa.Column("num_failed_steps", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("session_id"),
    )
    op.create_table(
        "snapshots",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=True),
        sa.Column("kv_usage", sa.Float(), nullable=True),
        sa.Column("blocks_total", sa.Integer(), nullable=True),
        sa.Column("blocks_free", sa.Integer(), nullable=True),
        sa.Column("blocks_resident", sa.Integer(), nullable=True),
        sa.Column("session_blocks", sa.Integer(), nullable=True),
        sa.Column("session_evicted_blocks", sa.Integer(), nullable=True),
        sa.Column("session_evicted_idle_blocks", sa.Integer(), nullable=True),
        sa.Column("session_hit_tokens", sa.Integer(), nullable=True),
        sa.Column("hit_rate", sa.Float(), nullable=True),
        sa.Column("num_running", sa.Integer(), nullable=True),
        sa.Column("num_waiting", sa.Integer(), nullable=True),
        sa.Column("preemptions_total", sa.Integer(), nullable=True),
        sa.Column("evictions_total", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.create_index("ix_snapshots_instance_ts", ["instance", "ts"], unique=False)
        batch_op.create_index("ix_snapshots_session_ts", ["session_id", "ts"], unique=False)

    op.create_table(
        "steps",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("trace_id", sa.String(length=32), nullable=True),
        sa.Column("span_id", sa.String(length=16), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=8), nullable=False),
        sa.Column("error_type", sa.String(length=255), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("e2e_s", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("session_id", "step_index"),
    )
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.create_index("ix_steps_trace_id", ["trace_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_index("ix_steps_trace_id")

    op.drop_table("steps")
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.drop_index("ix_snapshots_session_ts")
        batch_op.drop_index("ix_snapshots_instance_ts")

    op.drop_table("snapshots")
    op.drop_table("sessions")
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_index("ix_requests_trace_id")
        batch_op.drop_index("ix_requests_session_id")
        batch_op.drop_index("ix_requests_arrival_ts")

    op.drop_table("requests")
    with op.batch_alter_table("metric_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_metric_samples_name_ts")
        batch_op.drop_index("ix_metric_samples_instance_ts")

    op.drop_table("metric_samples")
    with op.batch_alter_table("kv_events", schema=None) as batch_op:
        batch_op.drop_index("ix_kv_events_session_ts")
        batch_op.drop_index("ix_kv_events_instance_ts")
        batch_op.drop_index("ix_kv_events_block_hash")

    op.drop_table("kv_events")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_index("ix_alerts_ts")
        batch_op.drop_index("ix_alerts_rule_ts")

    op.drop_table("alerts")
