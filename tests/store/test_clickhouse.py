"""The ClickHouse store on chDB (ClickHouse's current engine, in-process): URLs, schema, migrations, writes that a
retry cannot double, a refused row dropped alone, and the one-line errors for a locked directory or a server that
is not there. What every read answers is `test_contract.py`."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import fields

import pytest

from kvobs.store import StoreWriter, open_store
from kvobs.store.clickhouse import StoreUnreachable
from kvobs.store.clickhouse.ddl import VERSIONS_TABLE, head
from kvobs.store.clickhouse.store import GENERATED
from kvobs.store.rows import RECORDS, KVEventRecord, SessionRecord
from tests.server.conftest import free_port


@pytest.fixture
def chdb_store(tmp_path):
    store = open_store(f"chdb:///{tmp_path / 'ch'}")
    yield store
    store.close()


def _events(n: int, **extra) -> list[KVEventRecord]:
    return [
        KVEventRecord(ts=1000.0 + i, instance="e", kind="stored", block_hash=2**64 - 1 - i, **extra) for i in range(n)
    ]


def test_chdb_urls_follow_sqlites_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = open_store("chdb:///rel/ch")
    relative.close()
    assert (tmp_path / "rel" / "ch").is_dir()
    absolute = open_store(f"chdb:///{tmp_path / 'abs'}")  # chdb:////tmp/...: four slashes
    absolute.close()
    assert (tmp_path / "abs").is_dir()
    with pytest.raises(ValueError, match="names no directory"):
        open_store("chdb://")


def test_schema_is_made_for_the_workload_and_migrates_once(tmp_path):
    url = f"chdb:///{tmp_path / 'ch'}"
    open_store(url).close()
    store = open_store(url)
    versions = store.frame(f"SELECT version FROM {VERSIONS_TABLE}")
    assert sorted(versions["version"].tolist()) == list(range(1, head() + 1))  # each migration once
    tables = store.frame(
        "SELECT name, engine, sorting_key, partition_key FROM system.tables WHERE database = currentDatabase()"
    ).set_index("name")
    assert tables.loc["kv_events", "engine"] == "MergeTree"
    assert tables.loc["kv_events", "sorting_key"] == "instance, kind, ts"
    assert "86400" in tables.loc["kv_events", "partition_key"]
    assert tables.loc["sessions", "engine"] == "ReplacingMergeTree"
    types = store.column_types("kv_events")
    assert types["block_hash"] == "Nullable(UInt64)" and types["kind"] == "LowCardinality(String)"
    assert types["instance"] == "LowCardinality(String)"
    store.close()


def _session_ranges(store) -> dict[str, tuple[float, float]]:
    frame = store.frame(
        "SELECT session_id, min(first_ts) AS first, max(last_ts) AS last FROM kv_event_sessions GROUP BY session_id"
    )
    return {sid: (first, last) for sid, first, last in zip(frame["session_id"], frame["first"], frame["last"])}


def test_events_without_a_session_leave_no_row_in_the_session_lookup_after_schema_3(tmp_path):
    from kvobs.store.clickhouse import ddl

    def write(store, ts: float, session_id: str | None) -> None:
        writer = StoreWriter(store)
        writer.add_many([KVEventRecord(ts=ts, instance="e", kind="cleared", session_id=session_id)])
        writer.close()

    url = f"chdb:///{tmp_path / 'ch'}"
    old = open_store(url, migrate=False)
    ddl.migrate_to(old.client, 2)
    write(old, 10.0, None)
    write(old, 11.0, "s1")
    write(old, 12.0, "")  # an empty session id is a value, not "no session"
    assert _session_ranges(old)[""] == (10.0, 12.0)  # schema 2: the session-less row counted as session ''
    old.close()

    store = open_store(url)  # migrates to 3
    assert _session_ranges(store) == {"s1": (11.0, 11.0), "": (12.0, 12.0)}
    write(store, 20.0, None)
    write(store, 21.0, "s1")
    assert _session_ranges(store) == {"s1": (11.0, 21.0), "": (12.0, 12.0)}
    assert store.reads.kv_events(session_id="s1")["ts"].tolist() == [11.0, 21.0]
    views = set(
        store.frame(
            "SELECT name FROM system.tables WHERE engine = 'MaterializedView' AND database = currentDatabase()"
        )["name"]
    )
    assert "kv_event_sessions_mv" not in views and "kv_event_session_ranges_mv" in views
    store.close()


def test_a_retried_batch_is_stored_once(chdb_store):
    batch = [("insert", _events(100))]
    chdb_store.write(batch, token="batch-1")
    chdb_store.write(batch, token="batch-1")  # the answer to the first was lost; the writer sends it again
    chdb_store.write(batch, token="batch-2")  # a different batch with the same rows is stored
    assert len(chdb_store.reads.kv_events()) == 200


def test_async_inserts_are_acknowledged_when_written_and_a_retry_is_still_stored_once(tmp_path):
    store = open_store(f"chdb:///{tmp_path / 'ch'}?async_insert=1")
    settings = {"async_insert": 1, "wait_for_async_insert": 1, "async_insert_deduplicate": 1}
    assert store.client.insert_settings == settings
    batch = [("insert", _events(100))]
    store.write(batch, token="batch-1")
    assert len(store.reads.kv_events()) == 100  # written when the insert returned
    store.write(batch, token="batch-1")
    assert len(store.reads.kv_events()) == 100
    store.close()
    with pytest.raises(ValueError, match="unknown option"):
        open_store(f"chdb:///{tmp_path / 'other'}?asynk_insert=1")


def test_a_refused_row_is_dropped_alone(chdb_store):
    writer = StoreWriter(chdb_store)
    writer.add_many(_events(50) + [KVEventRecord(ts=1.0, instance="e", kind="stored", block_hash=2**64)])
    writer.close()
    assert (writer.num_written, writer.num_dropped) == (50, 1)
    assert len(chdb_store.reads.kv_events()) == 50


def test_session_columns_merge_as_on_sql(chdb_store):
    """The SDK, the engine and the collector each write some of a session's columns; none overwrites another's."""
    writer = StoreWriter(chdb_store)
    writer.insert_missing(SessionRecord("s1", source="engine", started_at=5.0))
    writer.upsert(SessionRecord("s1", num_steps=2, source="sdk"))
    writer.flush()
    writer.insert_missing(SessionRecord("s1", source="vllm", started_at=9.0))  # exists: left as it is
    writer.upsert(SessionRecord("s1", ended_at=20.0))
    writer.close()
    (row,) = chdb_store.reads.sessions().to_dict("records")
    assert (row["source"], row["started_at"], row["num_steps"], row["ended_at"]) == ("sdk", 5.0, 2, 20.0)


def test_a_chdb_store_open_in_another_process_is_a_one_line_error_naming_the_lock(tmp_path):
    url = f"chdb:///{tmp_path / 'ch'}"
    code = f"from kvobs.store import open_store; store = open_store({url!r}); print('open', flush=True); "
    holder = subprocess.Popen(
        [sys.executable, "-c", code + "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        result = subprocess.run(
            [sys.executable, "-m", "kvobs.cli", "alerts", "--store", url], capture_output=True, text=True, timeout=120
        )
    finally:
        holder.kill()
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("kvobs alerts:")]
    assert "open in another process" in line and "status" in line and "clickhouse://" in line


def test_an_unreachable_clickhouse_server_is_a_one_line_error():
    start = time.monotonic()
    with pytest.raises(StoreUnreachable, match=r"ClickHouse at 127\.0\.0\.1:\d+ cannot be reached") as caught:
        open_store(f"clickhouse://default@127.0.0.1:{free_port()}/kvobs")
    assert "\n" not in str(caught.value) and time.monotonic() - start < 30


def test_each_record_has_exactly_its_tables_columns_in_the_clickhouse_ddl(chdb_store):
    """The records in `kvobs.store.rows` are the one definition of each table's columns; the ClickHouse DDL (as
    migrated to its head) must hold exactly those and the two the writer fills (`id`, and `version`, which orders a
    ReplacingMergeTree's updates): a field added to a record without a ClickHouse migration, or a column left behind,
    fails here (SQL's twin is in test_store.py)."""
    for table, record in RECORDS.items():
        described = chdb_store.client.query_df(f"DESCRIBE TABLE {table}")
        columns = set(described["name"]) - set(GENERATED)
        assert columns == {f.name for f in fields(record)}, table


def test_the_time_range_leaves_out_empty_tables(chdb_store):
    """The first and last time come from the parts' own minmax index where a table is partitioned by day, where an
    empty table gives 0: it must not stretch the range to 1970."""
    from kvobs.store.rows import SnapshotRecord, StepRecord

    assert chdb_store.reads.time_range() is None
    chdb_store.write([("insert", [StepRecord(session_id="s", step_index=0, started_at=1.8e9, status="ok")])])
    assert chdb_store.reads.time_range() == (1.8e9, 1.8e9)
    chdb_store.write([("insert", [SnapshotRecord(ts=1.8e9 + 5, instance="a", kv_usage=0.5)])])
    assert chdb_store.reads.time_range() == (1.8e9, 1.8e9 + 5)
