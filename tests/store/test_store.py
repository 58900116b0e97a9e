"""The store on SQLite and PostgreSQL: schema via Alembic, lossless hashes, the batched writer."""

from __future__ import annotations

import time
from dataclasses import FrozenInstanceError, fields

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, inspect, select, text

from kvobs.semconv.attributes import MAX_OWNER_CHARS, tier_name
from kvobs.semconv.limits import MAX_TIER_CHARS
from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import RECORDS, AlertRecord, KVEventRecord, RequestRecord, SessionRecord, StepRecord
from kvobs.store.schema import TABLES, Base, KVEventRow, RequestRow, SessionRow, StepRow

REQUIRED = {
    "sessions": {"session_id", "agent_name", "started_at", "ended_at", "num_steps", "num_failed_steps", "source"},
    "steps": {
        "id",
        "session_id",
        "step_index",
        "trace_id",
        "span_id",
        "started_at",
        "ended_at",
        "status",
        "error_type",
        "ttft_s",
        "e2e_s",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
    },
    "requests": {
        "request_id",
        "instance",
        "session_id",
        "trace_id",
        "arrival_ts",
        "first_token_ts",
        "finished_ts",
        "queue_s",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "num_preemptions",
        "finish_reason",
    },
    "kv_events": {
        "id",
        "ts",
        "instance",
        "kind",
        "block_hash",
        "parent_hash",
        "num_tokens",
        "session_id",
        "request_id",
        "reason",
        "medium",
    },
    "snapshots": {
        "id",
        "ts",
        "instance",
        "session_id",
        "kv_usage",
        "blocks_total",
        "blocks_free",
        "blocks_resident",
        "session_blocks",
        "hit_rate",
        "num_running",
        "num_waiting",
        "preemptions_total",
        "evictions_total",
    },
    "metric_samples": {"ts", "instance", "name", "labels", "value"},
    "alerts": {"id", "ts", "rule", "severity", "state", "instance", "session_id", "value", "summary"},
}


def test_open_migrates_to_the_documented_schema(store):
    inspector = inspect(store.engine)
    for table, columns in REQUIRED.items():
        assert columns <= {c["name"] for c in inspector.get_columns(table)}, table
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == _head()
    open_store(store.url).close()  # opening again is a no-op upgrade


def test_migrations_match_the_models(store):
    """The Alembic history builds exactly the tables `kvobs.store.schema` declares (no drift)."""
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_unsigned_64_bit_hashes_round_trip_and_are_queryable(store):
    big, small = 2**64 - 5, 7
    writer = StoreWriter(store)
    for h, parent in ((big, None), (small, big)):
        writer.add(KVEventRecord(ts=1.0, instance="e0", kind="stored", block_hash=h, parent_hash=parent))
    writer.close()
    with store.session() as s:
        rows = s.scalars(select(KVEventRow).order_by(KVEventRow.id)).all()
        assert [(r.block_hash, r.parent_hash) for r in rows] == [(big, None), (small, big)]
        hit = s.scalars(select(KVEventRow).where(KVEventRow.block_hash == big)).one()
        assert hit.kind == "stored"
    with pytest.raises(ValueError, match="not an unsigned 64-bit"):
        KVEventRow.__table__.c.block_hash.type.process_bind_param(-1, store.engine.dialect)


def test_the_longest_tier_name_is_stored(store):
    """A REMOTE shared storage tier owned by a secondary tier is the longest name `tier_name` gives; PostgreSQL's
    column took 16 characters before revision 0022."""
    name, known = tier_name("SHARED_STORAGE", "REMOTE", "k" * 40)
    assert known and len(name) == len("REMOTE_SHARED_STORAGE/") + MAX_OWNER_CHARS <= MAX_TIER_CHARS
    writer = StoreWriter(store)
    writer.add(KVEventRecord(ts=1.0, instance="e0", kind="tier_stored", block_hash=7, medium=name))
    writer.close()
    assert list(store.reads.kv_events()["medium"]) == [name]


def test_a_units_on_written_is_called_once_its_rows_are_committed_in_queue_order(store):
    """What a stream worker that writes the store itself acknowledges by: each unit's callback, after its batch
    commits (its rows are readable then), in the order queued; none for a unit the full queue dropped."""
    writer = StoreWriter(store, max_queue=10)
    seen: list[tuple[int, int]] = []  # (unit, rows stored when it was called)

    def stored() -> int:
        with store.session() as s:
            return s.scalar(select(func.count()).select_from(KVEventRow))

    for unit in range(3):
        records = [
            KVEventRecord(ts=float(unit), instance="e0", kind="stored", block_hash=unit * 10 + i) for i in range(3)
        ]
        assert writer.add_many(records, on_written=lambda u=unit: seen.append((u, stored())))
    too_many = [KVEventRecord(ts=9.0, instance="e0", kind="stored", block_hash=90 + i) for i in range(11)]
    assert not writer.add_many(too_many, on_written=lambda: seen.append((9, -1)))
    writer.close()
    assert [u for u, _ in seen] == [0, 1, 2] and all(n >= 3 * (u + 1) for u, n in seen)
    assert writer.num_dropped == 11


def test_writer_batches_flushes_and_upserts(store):
    writer = StoreWriter(store, batch_size=400)
    for i in range(2500):
        writer.add(StepRecord(session_id=f"s{i % 10}", step_index=i // 10, started_at=float(i), status="ok"))
    writer.upsert(SessionRecord(session_id="s1", started_at=1.0, num_steps=1, source="sdk"))
    writer.upsert(SessionRecord(session_id="s1", num_steps=2, num_failed_steps=1))
    assert writer.flush()
    writer.upsert(SessionRecord(session_id="s1", num_steps=3, ended_at=9.0))
    writer.close()
    assert writer.num_written == 2503 and writer.num_dropped == 0
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(StepRow)) == 2500
        row = s.get(SessionRow, "s1")
        assert (row.started_at, row.num_steps, row.num_failed_steps, row.ended_at, row.source) == (
            1.0,
            3,
            1,
            9.0,
            "sdk",
        )


def test_upserts_of_one_batch_keep_their_order_whatever_columns_each_gives(any_store):
    """Upserts with different column sets in one batch: the later value of a column wins. (The SQL writer grouped
    them by column set and ran the groups in the order each set first appeared: a session's first upsert, with
    `started_at`, ran after its later ones when another session's plain upsert came first, so a span-derived
    session of 3 steps read `num_steps` 1.)"""
    any_store.write(
        [
            ("upsert", [SessionRecord("x", num_steps=3, num_failed_steps=0)]),
            ("upsert", [SessionRecord("y", started_at=1.0, num_steps=1, num_failed_steps=0, source="otel-genai")]),
            ("upsert", [SessionRecord("y", num_steps=2, num_failed_steps=0)]),
            ("upsert", [SessionRecord("y", num_steps=3, num_failed_steps=1)]),
            ("insert_missing", [SessionRecord("y", started_at=0.5, source="vllm")]),
        ]
    )
    sessions = any_store.reads.sessions().set_index("session_id")
    assert sessions.loc["y", ["started_at", "num_steps", "num_failed_steps", "source"]].tolist() == [
        1.0,
        3,
        1,
        "otel-genai",
    ]
    assert sessions.loc["x", "num_steps"] == 3


def test_committed_rows_survive_a_reopen(store_url):
    store = open_store(store_url)
    writer = StoreWriter(store)
    writer.add(AlertRecord(ts=5.0, rule="PrefixLostDuringToolPause", severity="warning", state="firing"))
    writer.close()
    store.close()
    again = open_store(store_url)
    with again.engine.connect() as conn:
        assert conn.execute(text("SELECT rule, state FROM alerts")).all() == [("PrefixLostDuringToolPause", "firing")]
    again.close()


def test_unreachable_database_never_blocks_the_producer():
    store = open_store("postgresql://postgres@127.0.0.1:1/test", migrate=False)
    writer = StoreWriter(store, max_queue=10, batch_size=5, flush_interval_s=0.05, max_backoff_s=0.2)
    start = time.monotonic()
    accepted = sum(writer.add(KVEventRecord(ts=float(i), instance="e0", kind="evicted")) for i in range(30))
    assert time.monotonic() - start < 1.0  # the producer never waited on the database
    assert accepted <= 15 and writer.num_dropped == 30 - accepted
    deadline = time.monotonic() + 10
    while writer.num_failed_attempts < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    writer.close(timeout_s=10)
    assert writer.num_written == 0 and writer.num_dropped == 30
    store.close()


@pytest.mark.parametrize("url", ["mysql://root@localhost/kvobs", "redis://127.0.0.1:6379", "not a url"])
def test_unknown_store_scheme_is_a_clear_error(url):
    with pytest.raises(ValueError, match="store"):
        open_store(url)


def test_a_misspelt_or_missing_column_is_a_type_error_when_the_record_is_made():
    with pytest.raises(TypeError, match="blok_hash"):
        KVEventRecord(ts=1.0, instance="e", kind="stored", blok_hash=7)
    with pytest.raises(TypeError, match="status"):
        StepRecord(session_id="s", step_index=0, started_at=1.0)
    with pytest.raises(FrozenInstanceError):
        KVEventRecord(ts=1.0, instance="e", kind="stored").kind = "evicted"


def test_each_record_has_exactly_its_tables_public_columns():
    assert set(RECORDS) == set(TABLES)
    for table, record in RECORDS.items():
        columns = {c.name for c in TABLES[table].__table__.columns} - {"id"}
        assert {f.name for f in fields(record)} == columns, table


def test_the_writer_takes_records_only(store):
    writer = StoreWriter(store)
    with pytest.raises(TypeError, match="records"):
        writer.add({"ts": 1.0, "instance": "e", "kind": "stored"})
    writer.close()
    assert writer.num_dropped == 0


def test_a_refused_row_does_not_take_its_batch_with_it(store):
    writer = StoreWriter(store, batch_size=100)
    writer.add(StepRecord(session_id="s", step_index=0, started_at=1.0, status="ok"))
    writer.add(StepRecord(session_id="s", step_index=1, started_at=2.0, status="ok"))
    writer.add(StepRecord(session_id="s", step_index=1, started_at=3.0, status="ok"))  # duplicate key
    writer.add(StepRecord(session_id="s", step_index=2, started_at=4.0, status="ok"))
    writer.close()
    assert (writer.num_written, writer.num_dropped) == (3, 1)
    with store.session() as s:
        assert s.scalars(select(StepRow.started_at).order_by(StepRow.step_index)).all() == [1.0, 2.0, 4.0]


def test_rows_with_different_column_sets_share_a_batch(store):
    writer = StoreWriter(store)
    writer.add(KVEventRecord(ts=1.0, instance="e", kind="hit", num_tokens=32, reason=None))
    writer.add(KVEventRecord(ts=2.0, instance="e", kind="allocated", num_tokens=16))
    writer.add(KVEventRecord(ts=3.0, instance="e", kind="stored", block_hash=2**64 - 1))
    writer.close()
    assert (writer.num_written, writer.num_dropped) == (3, 0)
    with store.session() as s:
        rows = s.execute(select(KVEventRow.kind, KVEventRow.num_tokens, KVEventRow.block_hash).order_by(KVEventRow.ts))
        assert rows.all() == [("hit", 32, None), ("allocated", 16, None), ("stored", None, 2**64 - 1)]


def test_insert_missing_keeps_the_existing_row(store):
    writer = StoreWriter(store)
    writer.upsert(SessionRecord(session_id="s1", agent_name="ops", source="sdk", started_at=1.0))
    writer.insert_missing(SessionRecord(session_id="s1", source="engine", started_at=5.0))
    writer.insert_missing(SessionRecord(session_id="s2", source="engine", started_at=5.0))
    writer.insert_missing(SessionRecord(session_id="s2", source="engine", started_at=7.0))
    writer.close()
    with store.session() as s:
        assert (s.get(SessionRow, "s1").source, s.get(SessionRow, "s1").started_at) == ("sdk", 1.0)
        assert (s.get(SessionRow, "s2").source, s.get(SessionRow, "s2").started_at) == ("engine", 5.0)


def test_a_row_sqlalchemy_cannot_bind_is_dropped_and_the_writer_lives_on(store):
    writer = StoreWriter(store)
    writer.add(KVEventRecord(ts=1.0, instance="e", kind="stored", block_hash="not a number"))
    writer.add(KVEventRecord(ts=2.0, instance="e", kind="stored", block_hash=7))
    assert writer.flush()
    writer.add(KVEventRecord(ts=3.0, instance="e", kind="stored", block_hash=8))
    writer.close()
    assert (writer.num_written, writer.num_dropped) == (2, 1)
    with store.session() as s:
        assert s.scalars(select(KVEventRow.block_hash).order_by(KVEventRow.ts)).all() == [7, 8]


def test_plain_inserts_get_the_column_defaults(store):
    """Rows that leave out defaulted columns (num_steps, num_preemptions) still insert, on both backends."""
    writer = StoreWriter(store)
    writer.add(SessionRecord(session_id="d1", source="vllm"))
    writer.add_many([RequestRecord(request_id=f"r{i}", instance="e", arrival_ts=float(i)) for i in range(3)])
    writer.close()
    assert (writer.num_written, writer.num_dropped) == (4, 0)
    with store.session() as s:
        assert s.get(SessionRow, "d1").num_steps == 0
        assert s.scalars(select(RequestRow.num_preemptions)).all() == [0, 0, 0]


def test_a_value_the_database_cannot_hold_is_dropped_alone(store):
    """Reliability probe F2: one KV event with `num_tokens` >= 2**63 (a valid msgpack uint64 `block_size`) raised
    OverflowError in the SQLite writer and took its whole batch with it (0 of 50 valid rows stored)."""
    writer = StoreWriter(store)
    good = [KVEventRecord(ts=float(i), instance="e", kind="stored", block_hash=i, num_tokens=16) for i in range(50)]
    writer.add_many([*good[:25], KVEventRecord(ts=99.0, instance="e", kind="stored", num_tokens=2**63), *good[25:]])
    writer.close()
    assert (writer.num_written, writer.num_dropped) == (50, 1)
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(KVEventRow)) == 50


def _head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from kvobs.store.sql.store import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head()
