"""A directory of Dynamo's request-trace shards followed as Dynamo writes them (`kvobs collect --dynamo-trace DIR`), on
the trace Dynamo 1.6.1's frontend wrote (`tests/fixtures/dynamo-trace/record.py`): shard by shard, with one still
being written, the store ends as `kvobs import dynamo-trace` of the whole trace leaves it; and through a running
collector, with its rows counted on /metrics."""

from __future__ import annotations

import gzip
import logging
import time
from pathlib import Path

from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from collectors.dynamo_follow import DynamoTraceFollower
from collectors.dynamo_trace import import_dynamo_trace
from kvobs.commands.doctor import exposition_checks
from kvobs.store import StoreWriter, open_store

TRACE = Path(__file__).parents[1] / "fixtures" / "dynamo-trace" / "request_trace.jsonl"
KEYS = {"sessions": ["session_id"], "steps": ["session_id", "step_index"], "requests": ["request_id"]}


def _same_as_the_import(store, tmp_path) -> None:
    whole = open_store(f"sqlite:///{tmp_path / 'whole.db'}")
    import_dynamo_trace(whole, [TRACE])
    for read, key in KEYS.items():
        a, b = getattr(whole.reads, read)(), getattr(store.reads, read)()
        cols = [c for c in a.columns if c != "id"]
        assert len(a) > 0
        assert a.sort_values(key)[cols].reset_index(drop=True).equals(b.sort_values(key)[cols].reset_index(drop=True))
    whole.close()


def _shard(path: Path, lines: list[str]) -> bytes:
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))
    return path.read_bytes()


def test_gzipped_shards_are_read_as_they_grow_and_the_steps_go_on_across_them(tmp_path, caplog):
    lines = TRACE.read_text().splitlines()
    shards = tmp_path / "shards"
    store = open_store(f"sqlite:///{tmp_path / 'followed.db'}")
    writer = StoreWriter(store)
    follower = DynamoTraceFollower(writer, shards)
    with caplog.at_level(logging.WARNING):
        assert follower.poll() == 0
    assert "is not there" in caplog.text
    shards.mkdir()
    with caplog.at_level(logging.WARNING):
        assert follower.poll() == 0
    assert "no Dynamo request-trace shard" in caplog.text

    _shard(shards / "dynamo-request-trace.000000.jsonl.gz", lines[:4])
    # the next segment as Dynamo writes it: two flushed members, the second cut mid-stream, then the rest
    growing = shards / "dynamo-request-trace.000001.jsonl.gz"
    first = gzip.compress("".join(line + "\n" for line in lines[4:6]).encode())
    second = gzip.compress("".join(line + "\n" for line in lines[6:]).encode())
    growing.write_bytes(first + second[: len(second) // 2])
    read = follower.poll()  # the first segment, the second's first member, and what of the cut one decodes
    assert 6 <= read < len(lines)
    assert follower.poll() == 0  # nothing read twice; the cut line waits
    growing.write_bytes(first + second)
    assert follower.poll() == len(lines) - read
    (shards / "dynamo-request-trace.000002.jsonl.gz").write_bytes(b"\x1f\x8b not gzip at all")
    with caplog.at_level(logging.WARNING):
        assert follower.poll() == 0
    assert "is not gzip" in caplog.text and follower.summary.left_out["shards that are not gzip"] == 1
    writer.close()
    _same_as_the_import(store, tmp_path)
    assert follower.summary.steps == sum(1 for _ in store.reads.steps().itertuples())
    store.close()


def test_the_jsonl_sinks_file_is_read_to_its_last_whole_line_and_on_from_there(tmp_path):
    lines = TRACE.read_text().splitlines()
    sink = tmp_path / "dynamo-request-trace.jsonl"
    store = open_store(f"sqlite:///{tmp_path / 'followed.db'}")
    writer = StoreWriter(store)
    follower = DynamoTraceFollower(writer, tmp_path)
    sink.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])  # a line half written
    assert follower.poll() == 3
    with sink.open("a") as f:
        f.write(lines[3][40:] + "\n" + "\n".join(lines[4:]) + "\n")
    assert follower.poll() == len(lines) - 3
    assert follower.poll() == 0
    writer.close()
    _same_as_the_import(store, tmp_path)
    store.close()


def test_kvobs_collect_follows_the_directory_and_counts_its_rows(tmp_path, caplog):
    shards = tmp_path / "shards"
    shards.mkdir()
    lines = TRACE.read_text().splitlines()
    _shard(shards / "dynamo-request-trace.000000.jsonl.gz", [*lines[:5], "not json"])
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    collector = Collector(CollectorOptions(store_url=url, dynamo_trace=str(shards), interval_s=0.1))
    collector.start()
    try:
        assert "Dynamo request traces in" in collector.describe()
        deadline = time.monotonic() + 30
        while collector.dynamo.summary.rows < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        _shard(shards / "dynamo-request-trace.000001.jsonl.gz", lines[5:])  # read at stop at the latest
        exposed = generate_latest(collector.registry).decode()
        assert 'kvobs_collector_dynamo_trace_rows_total{outcome="stored"} 5.0' in exposed
        assert 'kvobs_collector_dynamo_trace_rows_total{outcome="left_out"} 1.0' in exposed
        # kvobs doctor, given the collector's /metrics, names the row left out; the log said why
        ok, words = {name: (ok, words) for name, ok, words in exposition_checks(exposed)}["(Dynamo request-trace rows)"]
        assert not ok and words.startswith("5 stored, 1 left out")
        assert "rows left out" in caplog.text and "lines that are not JSON" in caplog.text
    finally:
        collector.stop()
    store = open_store(url)
    _same_as_the_import(store, tmp_path)
    store.close()
