"""The ClickHouse schema, as versioned migrations run when a store is opened (Alembic's role on SQL backends).

The public columns are the SQL schema's (`kvobs.store.schema`, the schema table of docs/store.md), in ClickHouse types:
- Events (`kv_events`, `snapshots`, `metric_samples`, `alerts`) are append-only MergeTree tables partitioned by day
  (`intDiv(toUInt32(ts), 86400)`, so retention drops whole parts), sorted for the reads the pages make: `kv_events`
  by `(instance, kind, ts)`, with `kv_event_sessions` (a materialized view: each session's first and last event
  per instance) so one session's rows are a narrow read, and `kv_event_minutes` (a materialized view into a
  SummingMergeTree: events and blocks per minute, instance, kind and reason) for the time-series pages. Kinds,
  reasons and instance names are `LowCardinality`; block hashes `UInt64`.
- Rows that are updated (`sessions`, `steps`, `requests`) are `ReplacingMergeTree(version)`: an update inserts a
  newer version; reads use `FINAL`. Nothing is ever `UPDATE`d.
- `id` (events, steps, alerts) is assigned by the writer: unique and increasing in one writer's insert order, as
  the SQL row id is, and unique between writers (`store.ID_TAG_BITS`); SQL's row id does not exist on `requests`
  and `sessions` here. `version` is taken the same way, so a later write (from any writer) is a higher version.
- `leases` (version 7) records which writer holds which instance (`kvobs.store.clickhouse.leases`).
- `session_footprints` (version 2; a materialized view into an AggregatingMergeTree) keeps each session's latest
  footprint per instance, the rollup the Sessions page reads.
Every table deduplicates a retried insert by its token (`non_replicated_deduplication_window`).

A migration is never edited once released: a schema change is a new entry at the end of `MIGRATIONS`.
"""

from __future__ import annotations

import logging

from kvobs.store.clickhouse import rollups
from kvobs.store.schema import DAY_S, MINUTE_S

log = logging.getLogger(__name__)

VERSIONS_TABLE = "kvobs_schema_versions"
_DAY = f"intDiv(toUInt32(ts), {int(DAY_S)})"  # a partition per day, named by its number
_DEDUP = "SETTINGS non_replicated_deduplication_window = 1000"

_INITIAL = [
    f"""CREATE TABLE IF NOT EXISTS sessions (
        session_id String, agent_name Nullable(String), started_at Nullable(Float64), ended_at Nullable(Float64),
        num_steps Int32 DEFAULT 0, num_failed_steps Int32 DEFAULT 0, source LowCardinality(Nullable(String)),
        version UInt64
    ) ENGINE = ReplacingMergeTree(version) ORDER BY session_id {_DEDUP}""",
    f"""CREATE TABLE IF NOT EXISTS steps (
        id UInt64, session_id String, step_index Int32, trace_id Nullable(String), span_id Nullable(String),
        started_at Float64, ended_at Nullable(Float64), status LowCardinality(String), error_type Nullable(String),
        ttft_s Nullable(Float64), e2e_s Nullable(Float64), prompt_tokens Nullable(Int32),
        cached_tokens Nullable(Int32), completion_tokens Nullable(Int32), version UInt64,
        INDEX ix_trace_id trace_id TYPE bloom_filter GRANULARITY 4
    ) ENGINE = ReplacingMergeTree(version) ORDER BY (session_id, step_index) {_DEDUP}""",
    f"""CREATE TABLE IF NOT EXISTS requests (
        request_id String, instance LowCardinality(String), session_id Nullable(String), trace_id Nullable(String),
        span_id Nullable(String), parent_span_id Nullable(String), arrival_ts Float64,
        first_token_ts Nullable(Float64), finished_ts Nullable(Float64), queue_s Nullable(Float64),
        prompt_tokens Nullable(Int32), cached_tokens Nullable(Int32), completion_tokens Nullable(Int32),
        num_preemptions Int32 DEFAULT 0, finish_reason LowCardinality(Nullable(String)), version UInt64,
        INDEX ix_session_id session_id TYPE bloom_filter GRANULARITY 4
    ) ENGINE = ReplacingMergeTree(version) ORDER BY (instance, request_id) {_DEDUP}""",
    f"""CREATE TABLE IF NOT EXISTS kv_events (
        id UInt64, ts Float64, instance LowCardinality(String), kind LowCardinality(String),
        block_hash Nullable(UInt64), parent_hash Nullable(UInt64), num_tokens Nullable(Int32),
        session_id Nullable(String), request_id Nullable(String), reason LowCardinality(Nullable(String)),
        medium LowCardinality(Nullable(String)), first_owner Nullable(UInt8),
        INDEX ix_session_id session_id TYPE bloom_filter GRANULARITY 4,
        INDEX ix_block_hash block_hash TYPE bloom_filter GRANULARITY 4
    ) ENGINE = MergeTree PARTITION BY {_DAY} ORDER BY (instance, kind, ts) {_DEDUP}""",
    """CREATE TABLE IF NOT EXISTS kv_event_minutes (
        minute Float64, instance LowCardinality(String), kind LowCardinality(String), reason LowCardinality(String),
        events UInt64, blocks UInt64
    ) ENGINE = SummingMergeTree ORDER BY (instance, kind, reason, minute)""",
    f"""CREATE MATERIALIZED VIEW IF NOT EXISTS kv_event_minutes_mv TO kv_event_minutes AS
        SELECT floor(ts / {MINUTE_S:g}) * {MINUTE_S:g} AS minute, instance, kind, coalesce(reason, '') AS reason,
               count() AS events, sum(coalesce(first_owner, 0)) AS blocks
        FROM kv_events GROUP BY minute, instance, kind, reason""",
    """CREATE TABLE IF NOT EXISTS kv_event_sessions (
        session_id String, instance LowCardinality(String),
        first_ts SimpleAggregateFunction(min, Float64), last_ts SimpleAggregateFunction(max, Float64)
    ) ENGINE = AggregatingMergeTree ORDER BY (session_id, instance)""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS kv_event_sessions_mv TO kv_event_sessions AS
        SELECT assumeNotNull(session_id) AS session_id, instance, min(ts) AS first_ts, max(ts) AS last_ts
        FROM kv_events WHERE session_id IS NOT NULL GROUP BY session_id, instance""",
    f"""CREATE TABLE IF NOT EXISTS snapshots (
        id UInt64, ts Float64, instance LowCardinality(String), session_id Nullable(String),
        kv_usage Nullable(Float64), blocks_total Nullable(Int32), blocks_free Nullable(Int32),
        blocks_resident Nullable(Int32), session_blocks Nullable(Int32), session_evicted_blocks Nullable(Int32),
        session_evicted_idle_blocks Nullable(Int32), session_pending_idle_blocks Nullable(Int32),
        session_hit_tokens Nullable(Int32), hit_rate Nullable(Float64), num_running Nullable(Int32),
        num_waiting Nullable(Int32), preemptions_total Nullable(Int32), evictions_total Nullable(Int32),
        INDEX ix_session_id session_id TYPE bloom_filter GRANULARITY 4
    ) ENGINE = MergeTree PARTITION BY {_DAY} ORDER BY (instance, ts) {_DEDUP}""",
    f"""CREATE TABLE IF NOT EXISTS metric_samples (
        id UInt64, ts Float64, instance LowCardinality(String), name LowCardinality(String),
        labels Map(LowCardinality(String), String), value Float64
    ) ENGINE = MergeTree PARTITION BY {_DAY} ORDER BY (name, instance, ts) {_DEDUP}""",
    f"""CREATE TABLE IF NOT EXISTS alerts (
        id UInt64, ts Float64, rule LowCardinality(String), severity LowCardinality(String),
        state LowCardinality(String), instance Nullable(String), session_id Nullable(String), value Nullable(Float64),
        summary Nullable(String)
    ) ENGINE = MergeTree ORDER BY (ts, id) {_DEDUP}""",
]

# `session_footprints`: each session's latest footprint per instance, as one argMax state of the snapshot's values
# (a tuple, so NULL values are kept, not skipped) by (ts, id): the latest row, of equal times the last written.
_FOOTPRINT = [
    ("ts", "Float64"),
    ("kv_usage", "Nullable(Float64)"),
    *(
        (name, "Nullable(Int32)")
        for name in (
            "blocks_total",
            "blocks_free",
            "blocks_resident",
            "session_blocks",
            "session_evicted_blocks",
            "session_evicted_idle_blocks",
            "session_pending_idle_blocks",
            "session_hit_tokens",
        )
    ),
    ("hit_rate", "Nullable(Float64)"),
    *((name, "Nullable(Int32)") for name in ("num_running", "num_waiting", "preemptions_total", "evictions_total")),
]
FOOTPRINT_VALUES = [name for name, _ in _FOOTPRINT]  # the tuple's elements, in order
_FOOTPRINT_STATE = f"AggregateFunction(argMax, Tuple({', '.join(t for _, t in _FOOTPRINT)}), Tuple(Float64, UInt64))"
# (the filter in a subquery: in the outer WHERE, ClickHouse would read `session_id` as the assumeNotNull alias)
_FOOTPRINT_SELECT = (
    f"SELECT assumeNotNull(session_id) AS session_id, instance, argMaxState(tuple("
    f"{', '.join(FOOTPRINT_VALUES)}), (ts, id)) AS latest FROM (SELECT * FROM snapshots "
    "WHERE session_id IS NOT NULL) GROUP BY session_id, instance"
)
_SESSION_FOOTPRINTS = [
    f"""CREATE TABLE IF NOT EXISTS session_footprints (
        session_id String, instance LowCardinality(String), latest {_FOOTPRINT_STATE}
    ) ENGINE = AggregatingMergeTree ORDER BY (session_id, instance)""",
    f"CREATE MATERIALIZED VIEW IF NOT EXISTS session_footprints_mv TO session_footprints AS {_FOOTPRINT_SELECT}",
    f"INSERT INTO session_footprints {_FOOTPRINT_SELECT}",  # the snapshots stored before (argMax: twice is once)
]

# Version 3: version 1's view filtered sessions where ClickHouse reads `session_id` as its `assumeNotNull` alias (rows
# with none became session ''); the lookup is fed from a view that filters in a subquery, and the '' rows rebuilt.
_SESSION_RANGES = [
    """CREATE MATERIALIZED VIEW IF NOT EXISTS kv_event_session_ranges_mv TO kv_event_sessions AS
        SELECT assumeNotNull(session_id) AS session_id, instance, min(ts) AS first_ts, max(ts) AS last_ts
        FROM (SELECT session_id, instance, ts FROM kv_events WHERE session_id IS NOT NULL)
        GROUP BY session_id, instance""",
    "DROP VIEW IF EXISTS kv_event_sessions_mv",
    "ALTER TABLE kv_event_sessions DELETE WHERE session_id = '' SETTINGS mutations_sync = 2",
    """INSERT INTO kv_event_sessions SELECT '' AS session_id, instance, min(ts) AS first_ts, max(ts) AS last_ts
        FROM (SELECT instance, ts FROM kv_events WHERE session_id = '') GROUP BY instance""",
]


def _kv_columns_added(*columns: tuple[str, str, str]) -> list[str]:
    """`ALTER TABLE kv_events ADD COLUMN` statements, each (name, type, the column it follows)."""
    return [
        f"ALTER TABLE kv_events ADD COLUMN IF NOT EXISTS {name} {type_} AFTER {after}" for name, type_, after in columns
    ]


# Version 4: the blocks an event without a block hash covers (SQL revision 0008).
_NUM_BLOCKS = _kv_columns_added(("num_blocks", "Nullable(Int32)", "first_owner"))

# Version 5: engine runs (SQL revision 0009); the same run written twice (an engine and a collector) is one row.
_RUNS = [
    f"""CREATE TABLE IF NOT EXISTS runs (
        run_id String, instance LowCardinality(String), started_at Float64, source LowCardinality(String),
        model Nullable(String), num_blocks Nullable(Int32), block_size Nullable(Int32),
        eviction_policy LowCardinality(Nullable(String))
    ) ENGINE = ReplacingMergeTree ORDER BY run_id {_DEDUP}""",
]

# Version 6: steps from agent spans (SQL revision 0010): the server's response id, the tool calls before the step.
_STEP_JOIN = [
    "ALTER TABLE steps ADD COLUMN IF NOT EXISTS response_id Nullable(String) AFTER completion_tokens",
    "ALTER TABLE steps ADD COLUMN IF NOT EXISTS tools Nullable(String) AFTER response_id",
]

# Version 7: which writer holds which instance (SQL revision 0011; `kvobs.store.clickhouse.leases`).
_LEASES = [
    """CREATE TABLE IF NOT EXISTS leases (
        instance String, holder String, acquired_at Float64, expires_at Float64, written_at Float64
    ) ENGINE = ReplacingMergeTree(written_at) ORDER BY (instance, holder)""",
]


# Version 8: what vLLM says of a block beyond its hash (SQL revision 0012).
_KV_GROUPS = _kv_columns_added(
    ("group_idx", "Nullable(Int16)", "num_blocks"),
    ("kv_cache_spec_kind", "LowCardinality(Nullable(String))", "group_idx"),
    ("lora_name", "LowCardinality(Nullable(String))", "kv_cache_spec_kind"),
    ("extra_keys", "Nullable(String)", "lora_name"),
)

# Version 9: each failed step's verdict once its session settled (SQL revision 0013); decided again, the later wins.
_STEP_VERDICTS = [
    f"""CREATE TABLE IF NOT EXISTS step_verdicts (
        session_id String, step_index Int32, started_at Float64, status LowCardinality(String),
        error_type Nullable(String), trace_id Nullable(String), span_id Nullable(String),
        failure_cause LowCardinality(String), failure_kind LowCardinality(String), evidence Nullable(String),
        decided_at Float64
    ) ENGINE = ReplacingMergeTree(decided_at) ORDER BY (session_id, step_index) {_DEDUP}""",
]

# Version 10: per-minute rollups of instance snapshots, requests and their latencies' sketches (SQL revision 0014),
# filled from the rows stored before (`kvobs.store.clickhouse.rollups.fill`, the writer's own functions).
_ROLLUPS: list = [*rollups.STATEMENTS, rollups.fill]

# Version 11: a minmax skip index on the times the pages narrow `requests` and `steps` by (their sort keys are ids),
# so a range's rows are found without reading every row's time; built for the rows stored before.
_TIME_INDEXES = [
    f"ALTER TABLE {table} ADD INDEX IF NOT EXISTS ix_{column} {column} TYPE minmax GRANULARITY 1"
    for table, column in (("requests", "arrival_ts"), ("steps", "started_at"))
] + [
    f"ALTER TABLE {table} MATERIALIZE INDEX ix_{column} SETTINGS mutations_sync = 2"
    for table, column in (("requests", "arrival_ts"), ("steps", "started_at"))
]

# Version 12: each request's prefix lookup as the collector measured it, and its per-minute rollup (SQL revision
# 0015); nothing to fill (lookups are measured from KV events as they arrive). Measured once per request (the
# collector's `RoutingMeter`); a retried insert is deduplicated by its token.
_REQUEST_LOOKUPS = [
    f"""CREATE TABLE IF NOT EXISTS request_lookups (
        instance LowCardinality(String), request_id String, session_id Nullable(String), lookup_ts Float64,
        prompt_tokens Int32, block_size Int32, prompt_blocks Int32, own_blocks Int32, available_blocks Int32,
        best_blocks Int32, best_instance LowCardinality(Nullable(String)), routed_blocks Int32, cold_blocks Int32,
        invalidated_blocks Int32, pause_blocks Int32, capacity_blocks Int32, unexplained_blocks Int32,
        replicas_compared Int32, measured_at Float64,
        INDEX ix_session_id session_id TYPE bloom_filter GRANULARITY 4
    ) ENGINE = MergeTree PARTITION BY intDiv(toUInt32(lookup_ts), {int(DAY_S)}) ORDER BY (instance, lookup_ts)
    {_DEDUP}""",
    rollups.LOOKUP_STATEMENT,
    """CREATE TABLE IF NOT EXISTS lookup_progress (
        instance String, measured_to Float64, updated_at Float64
    ) ENGINE = ReplacingMergeTree(updated_at) ORDER BY instance""",
]

# Each verdict keeper's latest run (alembic 0016).
_VERDICT_PROGRESS = [
    """CREATE TABLE IF NOT EXISTS verdict_progress (
        keeper String, covers_from Float64, read_to Float64, updated_at Float64
    ) ENGINE = ReplacingMergeTree(updated_at) ORDER BY keeper""",
]

# Version 14: the server request a step made of an agent's spans was joined to, and how (alembic 0017).
_STEP_REQUESTS = [
    "ALTER TABLE steps ADD COLUMN IF NOT EXISTS request_id Nullable(String) AFTER tools",
    "ALTER TABLE steps ADD COLUMN IF NOT EXISTS request_join LowCardinality(Nullable(String)) AFTER request_id",
]

# Version 15: every step's verdict, with its slow cause and its latency's parts (alembic 0018); a step that
# succeeded has no failure cause.
_VERDICT_SECONDS = [
    "latency_s",
    "typical_s",
    "excess_s",
    "queue_s",
    "preempted_s",
    "prefill_s",
    "decode_s",
    "tool_s",
    "other_s",
]
_VERDICT_SECONDS += ["lost_recompute_s", "invalidated_recompute_s", "routed_recompute_s"]
_WHOLE_VERDICTS = [
    "ALTER TABLE step_verdicts MODIFY COLUMN failure_cause LowCardinality(Nullable(String))",
    "ALTER TABLE step_verdicts MODIFY COLUMN failure_kind LowCardinality(Nullable(String))",
    *(
        f"ALTER TABLE step_verdicts ADD COLUMN IF NOT EXISTS {name} {type_}"
        for name, type_ in (
            ("slow", "Nullable(Bool)"),
            ("slow_cause", "LowCardinality(Nullable(String))"),
            ("slow_s", "Nullable(Float64)"),
            ("slow_share", "Nullable(Float64)"),
            ("cause", "LowCardinality(Nullable(String))"),
            ("causes", "Nullable(String)"),
            ("num_requests", "Nullable(Int32)"),
            *((name, "Nullable(Float64)") for name in _VERDICT_SECONDS),
        )
    ),
    "ALTER TABLE step_verdicts ADD INDEX IF NOT EXISTS ix_decided_at decided_at TYPE minmax GRANULARITY 1",
    "ALTER TABLE step_verdicts MATERIALIZE INDEX ix_decided_at SETTINGS mutations_sync = 2",
]

# Version 16: the offload tier below a run's cache, in blocks (SQL revision 0019).
_RUN_TIERS = ["ALTER TABLE runs ADD COLUMN IF NOT EXISTS offload_blocks Nullable(Int32) AFTER eviction_policy"]

# Version 17: of a lookup's hit, the blocks held only in a lower tier (SQL revision 0020); rows before count 0.
_LOOKUP_TIERS = [
    "ALTER TABLE request_lookups ADD COLUMN IF NOT EXISTS tier_blocks Int32 DEFAULT 0 AFTER own_blocks",
    "ALTER TABLE lookup_minutes ADD COLUMN IF NOT EXISTS tier_tokens SimpleAggregateFunction(sum, Int64) DEFAULT 0 "
    "AFTER achieved_tokens",
]

# Version 18: a block's loss and its store back, known at ingest (SQL revision 0021); no read looks a block up by
# its hash any more, so its bloom-filter index goes (it cost every insert).
_BLOCK_CLOCK = [
    *_kv_columns_added(
        ("lifetime_s", "Nullable(Float64)", "extra_keys"),
        ("restored", "Nullable(UInt8)", "lifetime_s"),
        ("restored_after_s", "Nullable(Float64)", "restored"),
    ),
    "ALTER TABLE kv_events DROP INDEX IF EXISTS ix_block_hash",
]

# Version 19: the time before a step's request reached the server, apart from the rest outside the engine (alembic
# 0023); rows before hold NULL, their other_s holds it.
_VERDICT_BEFORE = ["ALTER TABLE step_verdicts ADD COLUMN IF NOT EXISTS before_s Nullable(Float64) AFTER other_s"]

# Version 20: where a request's cached tokens came from (alembic 0024); rows before hold NULL (the server's own).
_REQUEST_CACHED_FROM = [
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS cached_from LowCardinality(Nullable(String)) AFTER finish_reason"
]

# Version 21: the engine a run was of (alembic 0025); rows before hold NULL (not said).
_RUN_ENGINE = ["ALTER TABLE runs ADD COLUMN IF NOT EXISTS engine LowCardinality(Nullable(String)) AFTER offload_blocks"]

# Version 22: on a chain's first stored block, the tokens it shared with an earlier chain's start, less than a block
# (alembic 0026); rows before hold NULL (not compared).
_SHARED_STARTS = _kv_columns_added(("shared_start_tokens", "Nullable(Int32)", "restored_after_s"))

# Version 23: the session that started a session (alembic 0027); rows before hold NULL (not said).
_PARENT_SESSIONS = ["ALTER TABLE sessions ADD COLUMN IF NOT EXISTS parent_session_id Nullable(String) AFTER source"]

# Version 24: a verdict's other attribution columns as JSON (alembic 0028); rows before hold NULL (the page attributes).
_VERDICT_DETAIL = ["ALTER TABLE step_verdicts ADD COLUMN IF NOT EXISTS detail Nullable(String)"]

# Version 25: a request's lookup in a KV connector's own cache, as the connector's spans said it (alembic 0029).
_CONNECTOR_LOOKUPS = [
    f"""CREATE TABLE IF NOT EXISTS connector_lookups (
        request_id String, instance LowCardinality(String), connector LowCardinality(String), started_at Float64,
        ended_at Nullable(Float64), requested_tokens Nullable(Int32), hit_tokens Nullable(Int32),
        l1_hit_tokens Nullable(Int32), l2_hit_tokens Nullable(Int32),
        early_exit_reason LowCardinality(Nullable(String)),
        lookup_s Nullable(Float64), retrieve_s Nullable(Float64), store_s Nullable(Float64),
        num_retrieves Int32 DEFAULT 0, num_stores Int32 DEFAULT 0, trace_id Nullable(String), span_id Nullable(String),
        INDEX ix_request_id request_id TYPE bloom_filter GRANULARITY 4
    ) ENGINE = MergeTree PARTITION BY intDiv(toUInt32(started_at), {int(DAY_S)}) ORDER BY (instance, started_at)
    {_DEDUP}""",
]

# (version, description, statements), oldest first; a statement is SQL, or a function of the client.
MIGRATIONS: list[tuple[int, str, list]] = [
    (1, "initial schema", _INITIAL),
    (2, "session_footprints: each session's latest footprint per instance", _SESSION_FOOTPRINTS),
    (3, "kv_event_sessions: no row for events without a session", _SESSION_RANGES),
    (4, "kv_events.num_blocks: the blocks a hit, an allocation, a preemption or a reset covers", _NUM_BLOCKS),
    (5, "runs: each engine run, from a start with an empty cache", _RUNS),
    (6, "steps.response_id and steps.tools: steps from agent spans", _STEP_JOIN),
    (7, "leases: which writer holds which instance", _LEASES),
    (8, "kv_events.group_idx, kv_cache_spec_kind, lora_name, extra_keys", _KV_GROUPS),
    (9, "step_verdicts: each failed step's verdict once its session settled", _STEP_VERDICTS),
    (10, "snapshot_minutes, request_minutes, latency_minutes: per-minute rollups", _ROLLUPS),
    (11, "minmax indexes on requests.arrival_ts and steps.started_at", _TIME_INDEXES),
    (12, "request_lookups, lookup_minutes, lookup_progress: request lookups as measured", _REQUEST_LOOKUPS),
    (13, "verdict_progress: each verdict keeper's latest run", _VERDICT_PROGRESS),
    (14, "steps.request_id and steps.request_join: the request a step was joined to, and how", _STEP_REQUESTS),
    (15, "step_verdicts of every step: slow cause, latency parts", _WHOLE_VERDICTS),
    (16, "runs.offload_blocks: the offload tier below a run's cache", _RUN_TIERS),
    (17, "request_lookups.tier_blocks, lookup_minutes.tier_tokens: hits loaded from a lower tier", _LOOKUP_TIERS),
    (18, "kv_events.lifetime_s, restored, restored_after_s: losses and restores known at ingest", _BLOCK_CLOCK),
    (19, "step_verdicts.before_s: the time before a step's request reached the server", _VERDICT_BEFORE),
    (20, "requests.cached_from: the server's own count or the reply's", _REQUEST_CACHED_FROM),
    (21, "runs.engine: the engine a run was of", _RUN_ENGINE),
    (22, "kv_events.shared_start_tokens: a shared prefix shorter than a block", _SHARED_STARTS),
    (23, "sessions.parent_session_id: the session that started a session", _PARENT_SESSIONS),
    (
        24,
        "step_verdicts.detail: the attribution's other columns, so a settled page attributes nothing",
        _VERDICT_DETAIL,
    ),
    (25, "connector_lookups: a request's lookup in a KV connector's own cache", _CONNECTOR_LOOKUPS),
]


def migrate(client) -> int:
    """Run every migration the store has not had; return the schema version it is at now."""
    return migrate_to(client, head())


def migrate_to(client, target: int) -> int:
    """Run the migrations the store has not had, up to `target`; return the schema version it is at now."""
    client.command(
        f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} (version UInt32, description String, "
        "applied_at DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY version"
    )
    done = client.query_df(f"SELECT max(version) AS v FROM {VERSIONS_TABLE}")["v"].iloc[0]
    current = int(done) if done == done else 0  # NaN: an empty table
    for version, description, statements in MIGRATIONS:
        if version <= current or version > target:
            continue
        log.info("ClickHouse store: migrating to schema %d (%s)", version, description)
        for statement in statements:
            statement(client) if callable(statement) else client.command(statement)
        client.command(
            f"INSERT INTO {VERSIONS_TABLE} (version, description) VALUES ({{v:UInt32}}, {{d:String}})",
            {"v": version, "d": description},
        )
        current = version
    return current


def head() -> int:
    return MIGRATIONS[-1][0]
