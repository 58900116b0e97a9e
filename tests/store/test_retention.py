"""--retention-days: raw KV events older than the limit are dropped (chunked on SQL, whole days on ClickHouse), the
rest of the store is kept, and the count shows on the collector's /metrics; the progress marks of replicas and
verdict keepers not heard of for as long go too (every backend)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from kvobs.store import StoreWriter, open_store
from kvobs.store.retention import Retention
from kvobs.store.rows import (
    KVEventRecord,
    LookupProgressRecord,
    SessionRecord,
    SnapshotRecord,
    VerdictProgressRecord,
)
from kvobs.store.schema import DAY_S
from tests.waiting import wait_for

NOW = 1_795_000_000.0  # a day boundary plus 0.42 day: 1795000000 / 86400 = 20775.46


def _fill(store) -> list[float]:
    """One KV event every two hours over ten days before NOW, plus rows of other tables from the start."""
    times = [NOW - 10 * DAY_S + 7200.0 * i for i in range(120)]
    writer = StoreWriter(store)
    writer.add_many([KVEventRecord(ts=ts, instance="e", kind="stored", block_hash=i + 1) for i, ts in enumerate(times)])
    writer.add(SnapshotRecord(ts=times[0], instance="e", kv_usage=0.5))
    writer.upsert(SessionRecord("s", started_at=times[0]))
    writer.close()
    return times


def test_sql_stores_drop_exactly_the_events_older_than_the_cut_in_chunks(store):
    times = _fill(store)
    cut = NOW - 3 * DAY_S
    assert store.expire_kv_events(cut, chunk=7) == sum(ts < cut for ts in times)
    left = store.reads.kv_events()
    assert len(left) == sum(ts >= cut for ts in times) and left["ts"].min() >= cut
    assert len(store.reads.instance_snapshots()) == 1 and len(store.reads.sessions()) == 1  # other tables kept


def test_clickhouse_drops_whole_days_only(tmp_path):
    store = open_store(f"chdb:///{tmp_path / 'ch'}")
    times = _fill(store)
    cut = NOW - 3 * DAY_S  # 0.46 into a day: that day's earlier rows stay until the whole day is past
    first_kept_day = (cut // DAY_S) * DAY_S
    assert store.expire_kv_events(cut) == sum(ts < first_kept_day for ts in times)
    left = store.reads.kv_events()
    assert left["ts"].min() >= first_kept_day and (left["ts"] < cut).any()
    assert len(store.reads.instance_snapshots()) == 1
    store.close()


def test_retention_runs_at_start_and_is_counted_on_the_collectors_metrics(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    times = _fill(store)
    options = CollectorOptions(otlp_http="127.0.0.1:0", retention_days=3.0)
    collector = Collector(options, store=store)
    collector.retention.clock = lambda: NOW
    collector.start()
    try:
        wait_for(lambda: collector.retention.num_expired > 0)
        text = generate_latest(collector.registry).decode()
    finally:
        collector.stop()
    expected = sum(ts < NOW - 3 * DAY_S for ts in times)
    assert f'kvobs_store_rows_expired_total{{table="kv_events"}} {float(expected)}' in text


def test_progress_marks_not_updated_within_the_retention_are_dropped_and_the_fresh_kept(any_store):
    """A collector's verdict keeper writes its row under a name of its own process, so each restart leaves one
    behind, as does a replica taken out of the fleet: retention drops those not updated within it, keeps the live
    ones, and a mark updated again (a newer version of the row) survives its older versions."""
    writer = StoreWriter(any_store)
    old, fresh = NOW - 5 * DAY_S, NOW - 3600.0
    for keeper, updated in (("gone-1", old), ("gone-2", old - DAY_S), ("live", fresh)):
        writer.upsert(VerdictProgressRecord(keeper, old, updated, updated))
    writer.upsert(LookupProgressRecord(instance="retired", measured_to=old, updated_at=old))
    writer.upsert(LookupProgressRecord(instance="vllm-a", measured_to=old, updated_at=old))
    writer.flush()
    writer.upsert(LookupProgressRecord(instance="vllm-a", measured_to=fresh, updated_at=fresh))  # updated since
    writer.close()
    retention = Retention(any_store, 3.0, clock=lambda: NOW)
    retention.run_once()
    assert retention.num_progress_expired >= 3
    assert list(any_store.reads.verdict_progress()["keeper"]) == ["live"]
    marks = any_store.reads.lookup_progress()
    assert list(marks["instance"]) == ["vllm-a"] and list(marks["measured_to"]) == [fresh]


def test_a_non_positive_retention_is_refused():
    with pytest.raises(ValueError, match="retention-days"):
        Retention(None, 0)
