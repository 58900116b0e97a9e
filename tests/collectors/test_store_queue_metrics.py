"""The collector's store writer on its /metrics and in `kvobs doctor`: the rows it holds uncommitted and the oldest's
wait, now and at their peaks, and the units that found it full (what a burst leaves; `bench/collector_burst.py`
measures one)."""

from __future__ import annotations

from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from kvobs.commands.doctor import exposition_checks
from kvobs.store.rows import KVEventRecord


def test_the_store_queue_is_on_metrics_and_in_doctor(tmp_path, monkeypatch):
    """Rows a slow writer holds show as they wait (now and at their peak); doctor says so, and says a queue that
    filled is a problem."""
    options = CollectorOptions(
        store_url=f"sqlite:///{tmp_path / 'kvobs.db'}", dynamo_trace=str(tmp_path), interval_s=3600
    )
    collector = Collector(options)
    collector.start()
    try:
        writer = collector.writer
        writer.flush_interval_s, writer.batch_size = 30.0, 1_000_000  # (the rows wait: the writer's next batch)
        writer.flush()
        rows = [KVEventRecord(ts=1.0, instance="e0", kind="stored", block_hash=i) for i in range(500)]
        assert writer.add_many(rows)
        exposed = generate_latest(collector.registry).decode()
        assert "kvobs_store_queue_rows 500.0" in exposed and "kvobs_store_queue_peak_rows 500.0" in exposed
        assert "kvobs_store_queue_full_total 0.0" in exposed
        ok, words = {n: (ok, w) for n, ok, w in exposition_checks(exposed)}["(store queue)"]
        assert ok and words.startswith("500 rows waiting to be committed")
        monkeypatch.setattr(writer, "max_queue", 600)
        assert not writer.add_many(rows)  # (no room: dropped, and counted)
        exposed = generate_latest(collector.registry).decode()
        ok, words = {n: (ok, w) for n, ok, w in exposition_checks(exposed)}["(store queue)"]
        assert not ok and "1 unit(s) found it full" in words
        assert writer.flush()
        assert "kvobs_store_queue_rows 0.0" in generate_latest(collector.registry).decode()
    finally:
        collector.stop()
