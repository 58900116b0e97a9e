"""The store's tables: a public interface (users query it from Grafana, notebooks, plain SQL).

Times are UTC epoch seconds (float). `instance` names an engine or vLLM endpoint. Block hashes are the
unsigned 64-bit values vLLM publishes: NUMERIC(20) on PostgreSQL; on SQLite, whose integers are signed
64-bit, the same 8 bytes read as a signed integer (a value of 2^63 or more is stored as value - 2^64:
in SQL, `CASE WHEN block_hash < 0 THEN block_hash + 18446744073709551616 ...` gives it back, as a REAL).
Both read back as Python ints through kvobs. Schema changes go through Alembic (`kvobs/store/migrations`).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    Index,
    Integer,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from kvobs.semconv.limits import MAX_ID_BYTES, MAX_TIER_CHARS
from kvobs.store.rollup_tables import (
    KVEventMinuteRow,
    LatencyMinuteRow,
    LookupMinuteRow,
    RequestMinuteRow,
    SnapshotMinuteRow,
)
from kvobs.store.table_base import ROW_ID, Base
from kvobs.store.uint64 import UInt64

MINUTE_S = 60.0  # the rollup's step (`kv_event_minutes.minute`)
DAY_S = 86_400.0  # a retention day; ClickHouse partitions events by it


class SessionRow(Base):
    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    agent_name: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    started_at: Mapped[float | None] = mapped_column(Float)  # nullable: upserts may update counters only
    ended_at: Mapped[float | None] = mapped_column(Float)
    num_steps: Mapped[int] = mapped_column(Integer, default=0)
    num_failed_steps: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str | None] = mapped_column(String(16))  # sdk | vllm | engine
    parent_session_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))  # a subagent's caller's session


class StepRow(Base):
    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("session_id", "step_index"),
        Index("ix_steps_trace_id", "trace_id"),
        Index("ix_steps_started_at", "started_at"),
    )

    id: Mapped[int] = mapped_column(ROW_ID, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    step_index: Mapped[int] = mapped_column(Integer)
    trace_id: Mapped[str | None] = mapped_column(String(32))
    span_id: Mapped[str | None] = mapped_column(String(16))
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(8))  # ok | error
    error_type: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    ttft_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    response_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))  # the id the reply named
    request_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))  # the server request it was joined to
    request_join: Mapped[str | None] = mapped_column(String(16))  # how, or why not (StepJoin)
    tools: Mapped[str | None] = mapped_column(Text)  # JSON: the tool calls in the pause before this step


class StepVerdictRow(Base):
    """Each step's verdict, written once its session has settled (`kvobs.analytics.steps.verdicts`): what the pages
    count over any range without attributing every step again."""

    __tablename__ = "step_verdicts"
    __table_args__ = (
        Index("ix_step_verdicts_started_at", "started_at"),
        Index("ix_step_verdicts_decided_at", "decided_at"),  # the alerts' window: steps decided in it
    )

    session_id: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    step_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(8))
    error_type: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    trace_id: Mapped[str | None] = mapped_column(String(32))
    span_id: Mapped[str | None] = mapped_column(String(16))
    failure_cause: Mapped[str | None] = mapped_column(String(32))  # failed steps: attribution.failure_verdict's
    failure_kind: Mapped[str | None] = mapped_column(String(16))  # cache | queue | timeout | model | request ...
    evidence: Mapped[str | None] = mapped_column(Text)
    decided_at: Mapped[float] = mapped_column(Float)  # when the writer decided it (epoch s)
    slow: Mapped[bool | None] = mapped_column(Boolean)
    slow_cause: Mapped[str | None] = mapped_column(String(32))
    slow_s: Mapped[float | None] = mapped_column(Float)
    slow_share: Mapped[float | None] = mapped_column(Float)
    cause: Mapped[str | None] = mapped_column(String(32))
    causes: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    num_requests: Mapped[int | None] = mapped_column(Integer)
    latency_s: Mapped[float | None] = mapped_column(Float)
    typical_s: Mapped[float | None] = mapped_column(Float)
    excess_s: Mapped[float | None] = mapped_column(Float)
    queue_s: Mapped[float | None] = mapped_column(Float)
    preempted_s: Mapped[float | None] = mapped_column(Float)
    prefill_s: Mapped[float | None] = mapped_column(Float)
    decode_s: Mapped[float | None] = mapped_column(Float)
    tool_s: Mapped[float | None] = mapped_column(Float)
    other_s: Mapped[float | None] = mapped_column(Float)
    before_s: Mapped[float | None] = mapped_column(Float)  # NULL before schema 0023: other_s held it
    lost_recompute_s: Mapped[float | None] = mapped_column(Float)
    invalidated_recompute_s: Mapped[float | None] = mapped_column(Float)
    routed_recompute_s: Mapped[float | None] = mapped_column(Float)
    detail: Mapped[str | None] = mapped_column(Text)  # JSON: the attribution's other columns (0028)


class RequestRow(Base):
    __tablename__ = "requests"
    __table_args__ = (
        UniqueConstraint("instance", "request_id"),
        Index("ix_requests_session_id", "session_id"),
        Index("ix_requests_trace_id", "trace_id"),
        Index("ix_requests_arrival_ts", "arrival_ts"),
    )

    id: Mapped[int] = mapped_column(ROW_ID, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    session_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    trace_id: Mapped[str | None] = mapped_column(String(32))
    span_id: Mapped[str | None] = mapped_column(String(16))
    parent_span_id: Mapped[str | None] = mapped_column(String(16))  # the caller's span (traceparent)
    arrival_ts: Mapped[float] = mapped_column(Float)
    first_token_ts: Mapped[float | None] = mapped_column(Float)
    finished_ts: Mapped[float | None] = mapped_column(Float)
    queue_s: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    num_preemptions: Mapped[int] = mapped_column(Integer, default=0)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    cached_from: Mapped[str | None] = mapped_column(String(8))  # (CachedFrom)


class RequestLookupRow(Base):
    """Each request's prefix lookup as the collector measured it (`kvobs.store.rows.RequestLookupRecord`), once,
    a few minutes after the lookup (`collectors.jobs.routing_meter`)."""

    __tablename__ = "request_lookups"
    __table_args__ = (
        Index("ix_request_lookups_lookup_ts", "lookup_ts"),
        Index("ix_request_lookups_session_id", "session_id"),
    )

    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    session_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    lookup_ts: Mapped[float] = mapped_column(Float)  # when it was first scheduled (`chains.lookup_ts`)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    block_size: Mapped[int] = mapped_column(Integer)
    prompt_blocks: Mapped[int] = mapped_column(Integer)  # its hash chain's blocks a lookup can find
    own_blocks: Mapped[int] = mapped_column(Integer)  # found on its own replica
    # of those, held there only in a lower tier (loaded); 0 on rows measured before schema 0020
    tier_blocks: Mapped[int] = mapped_column(Integer, server_default="0")
    available_blocks: Mapped[int] = mapped_column(Integer)  # some replica had stored before: prompt - cold
    best_blocks: Mapped[int] = mapped_column(Integer)  # the longest prefix another replica held
    best_instance: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    routed_blocks: Mapped[int] = mapped_column(Integer)
    cold_blocks: Mapped[int] = mapped_column(Integer)
    invalidated_blocks: Mapped[int] = mapped_column(Integer)
    pause_blocks: Mapped[int] = mapped_column(Integer)
    capacity_blocks: Mapped[int] = mapped_column(Integer)
    unexplained_blocks: Mapped[int] = mapped_column(Integer)
    replicas_compared: Mapped[int] = mapped_column(Integer)  # 0: no other replica to compare with
    measured_at: Mapped[float] = mapped_column(Float)


class ConnectorLookupRow(Base):
    """A request's lookup in a KV connector's own cache, as its spans said it
    (`kvobs.store.rows.ConnectorLookupRecord`). One row a connector request span (a span an exporter sent again is
    stored once: the collector remembers it)."""

    __tablename__ = "connector_lookups"
    __table_args__ = (
        Index("ix_connector_lookups_started_at", "started_at"),
        Index("ix_connector_lookups_request_id", "request_id"),
    )

    id: Mapped[int] = mapped_column(ROW_ID, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(MAX_ID_BYTES))  # as the connector named it
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    connector: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    requested_tokens: Mapped[int | None] = mapped_column(Integer)
    hit_tokens: Mapped[int | None] = mapped_column(Integer)
    l1_hit_tokens: Mapped[int | None] = mapped_column(Integer)
    l2_hit_tokens: Mapped[int | None] = mapped_column(Integer)
    early_exit_reason: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    lookup_s: Mapped[float | None] = mapped_column(Float)
    retrieve_s: Mapped[float | None] = mapped_column(Float)
    store_s: Mapped[float | None] = mapped_column(Float)
    num_retrieves: Mapped[int] = mapped_column(Integer, server_default="0")
    num_stores: Mapped[int] = mapped_column(Integer, server_default="0")
    trace_id: Mapped[str | None] = mapped_column(String(32))
    span_id: Mapped[str | None] = mapped_column(String(16))


class LookupProgressRow(Base):
    """How far a collector has measured each instance's request lookups (`kvobs.store.rows.LookupProgressRecord`)."""

    __tablename__ = "lookup_progress"

    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    measured_to: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class VerdictProgressRow(Base):
    """Each verdict keeper's latest run (`kvobs.store.rows.VerdictProgressRecord`)."""

    __tablename__ = "verdict_progress"

    keeper: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    covers_from: Mapped[float] = mapped_column(Float)
    read_to: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class KVEventRow(Base):
    __tablename__ = "kv_events"
    __table_args__ = (
        Index("ix_kv_events_instance_ts", "instance", "ts"),
        Index("ix_kv_events_session_ts", "session_id", "ts"),
        Index("ix_kv_events_ts", "ts"),
        Index("ix_kv_events_kind_ts", "kind", "ts"),
    )

    id: Mapped[int] = mapped_column(ROW_ID, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    kind: Mapped[str] = mapped_column(String(16))  # stored removed cleared hit allocated evicted preempted invalidated
    block_hash: Mapped[int | None] = mapped_column(UInt64)
    parent_hash: Mapped[int | None] = mapped_column(UInt64)
    num_tokens: Mapped[int | None] = mapped_column(Integer)
    session_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    request_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    reason: Mapped[str | None] = mapped_column(String(32))
    medium: Mapped[str | None] = mapped_column(String(MAX_TIER_CHARS))  # the tier (`semconv.attributes.tier_name`)
    # 1 on one row of each block event (the first owner's, when a lost block is recorded once per owning session),
    # 0 on the others, NULL on rows without a block: "blocks" is a sum, so rollups stay additive.
    first_owner: Mapped[int | None] = mapped_column(SmallInteger)
    # The blocks an event without a block hash covers (a prefix hit, an allocation, a preemption, a reset); NULL on
    # a block's own row (one block: `block_hash`), and on rows written before schema 0008 (unknown).
    num_blocks: Mapped[int | None] = mapped_column(Integer)
    # vLLM's group_idx, kv_cache_spec_kind, lora_name and extra_keys (JSON) of a block's event (schema 0012).
    group_idx: Mapped[int | None] = mapped_column(SmallInteger)
    kv_cache_spec_kind: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    lora_name: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    extra_keys: Mapped[str | None] = mapped_column(Text)
    # Known at ingest (`kvobs.block_clock`, schema 0021; NULL on rows written before): a loss's seconds since its
    # block was stored on its instance and tier; a store's 1 when it brought back a block lost there (and when).
    lifetime_s: Mapped[float | None] = mapped_column(Float)
    restored: Mapped[int | None] = mapped_column(SmallInteger)
    restored_after_s: Mapped[float | None] = mapped_column(Float)
    # On a chain's first stored block, the tokens it shared with an earlier chain's start, less than a block (0026).
    shared_start_tokens: Mapped[int | None] = mapped_column(Integer)


class SnapshotRow(Base):
    """One row per instance per interval (`session_id` null) and per session at every step."""

    __tablename__ = "snapshots"
    __table_args__ = (
        Index("ix_snapshots_instance_ts", "instance", "ts"),
        Index("ix_snapshots_session_ts", "session_id", "ts"),
    )

    id: Mapped[int] = mapped_column(ROW_ID, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    session_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    kv_usage: Mapped[float | None] = mapped_column(Float)
    blocks_total: Mapped[int | None] = mapped_column(Integer)
    blocks_free: Mapped[int | None] = mapped_column(Integer)
    blocks_resident: Mapped[int | None] = mapped_column(Integer)
    session_blocks: Mapped[int | None] = mapped_column(Integer)  # blocks the session holds or has cached
    session_evicted_blocks: Mapped[int | None] = mapped_column(Integer)  # evicted so far
    session_evicted_idle_blocks: Mapped[int | None] = mapped_column(Integer)  # ... in a tool pause (settled)
    session_pending_idle_blocks: Mapped[int | None] = mapped_column(Integer)  # ... while idle, not yet settled
    session_hit_tokens: Mapped[int | None] = mapped_column(Integer)
    hit_rate: Mapped[float | None] = mapped_column(Float)
    num_running: Mapped[int | None] = mapped_column(Integer)
    num_waiting: Mapped[int | None] = mapped_column(Integer)
    preemptions_total: Mapped[int | None] = mapped_column(Integer)
    evictions_total: Mapped[int | None] = mapped_column(Integer)


class SessionFootprintRow(Base):
    """The rollup of `snapshots`' session rows: each session's latest footprint on each instance (the row with the
    latest `ts`; of rows with equal `ts`, the one written last), kept by the writer in the transaction of the raw
    rows, so the Sessions page reads a row per session, not every snapshot ever taken. Same columns as `snapshots`
    without `id`."""

    __table__ = Table(
        "session_footprints",
        Base.metadata,
        *(column._copy() for column in SnapshotRow.__table__.columns if column.name != "id"),
        PrimaryKeyConstraint("session_id", "instance"),
        Index("ix_session_footprints_ts", "ts"),
    )


FOOTPRINT_COLUMNS = tuple(c.name for c in SessionFootprintRow.__table__.columns)  # snapshots' order, without id


class MetricSampleRow(Base):
    __tablename__ = "metric_samples"
    __table_args__ = (
        Index("ix_metric_samples_name_ts", "name", "ts"),
        Index("ix_metric_samples_instance_ts", "instance", "ts"),
    )

    id: Mapped[int] = mapped_column(ROW_ID, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    name: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    labels: Mapped[dict] = mapped_column(JSON, default=dict)
    value: Mapped[float] = mapped_column(Float)


class AlertRow(Base):
    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_ts", "ts"), Index("ix_alerts_rule_ts", "rule", "ts"))

    id: Mapped[int] = mapped_column(ROW_ID, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    rule: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))  # firing | resolved
    instance: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    session_id: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    value: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[str | None] = mapped_column(String(1024))


class RunRow(Base):
    """Each engine run: a start with an empty cache (an engine start; a replica's restart, seen by a collector).
    A run lasts until the next run of the same instance starts."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_instance_started_at", "instance", "started_at"),)

    run_id: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES))
    started_at: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))  # engine | collector
    model: Mapped[str | None] = mapped_column(String(MAX_ID_BYTES))
    num_blocks: Mapped[int | None] = mapped_column(Integer)
    block_size: Mapped[int | None] = mapped_column(Integer)
    eviction_policy: Mapped[str | None] = mapped_column(String(32))
    offload_blocks: Mapped[int | None] = mapped_column(Integer)  # the tier below the cache (0: none; NULL: not said)
    engine: Mapped[str | None] = mapped_column(String(16))  # kvobs | vllm (RunEngine); NULL: not said


class LeaseRow(Base):
    """Which writer holds which instance (`kvobs.store.leases`): one row per instance, kept by the claims."""

    __tablename__ = "leases"

    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    holder: Mapped[str] = mapped_column(String(MAX_ID_BYTES))  # role@host:pid/nonce
    acquired_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


# Tables written as records (`kvobs.store.rows`); rollups (`kv_event_minutes`) are kept by the writer.
TABLES = {
    cls.__tablename__: cls
    for cls in (
        SessionRow,
        StepRow,
        StepVerdictRow,
        RequestRow,
        RequestLookupRow,
        ConnectorLookupRow,
        LookupProgressRow,
        VerdictProgressRow,
        KVEventRow,
        SnapshotRow,
        MetricSampleRow,
        AlertRow,
        RunRow,
    )
}
# Tables the writer keeps from the raw rows in the same transaction; a copy of a store copies them too.
ROLLUPS = {
    str(cls.__table__.name): cls  # type: ignore[union-attr]
    for cls in (
        KVEventMinuteRow,
        SessionFootprintRow,
        SnapshotMinuteRow,
        RequestMinuteRow,
        LatencyMinuteRow,
        LookupMinuteRow,
    )
}
