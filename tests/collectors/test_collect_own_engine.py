"""The collector on our own `kvobs serve`: it speaks vLLM's dialects, so the same scrape, KV-event and OTLP
paths fill the store; the engine's extra attributes (session, cached tokens) come through."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from collectors.collector import Collector, CollectorOptions
from kvobs.store.schema import KVEventRow, MetricSampleRow, RequestRow, SnapshotRow
from tests.server.conftest import SERVED, free_port, running_server
from tests.waiting import wait_for

SYSTEM = "You are the planning agent of a travel company. Think step by step and call tools. " * 6


def chat(url: str, session: str, turn: int) -> dict:
    body = {
        "model": SERVED,
        "max_tokens": 4,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": f"Agent {session}. {SYSTEM}"},
            {"role": "user", "content": f"Turn {turn}"},
        ],
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Session-ID": session}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_collector_reads_kvobs_serve_like_a_vllm(smollm2_source, store):
    kv, replay, otlp = free_port(), free_port(), free_port()
    options = {
        "kv_events_endpoint": f"tcp://*:{kv}",
        "kv_events_replay_endpoint": f"tcp://*:{replay}",
        "otlp_endpoint": f"http://127.0.0.1:{otlp}",
    }
    sessions = ["own-a", "own-b", "own-c"]
    with running_server(smollm2_source, options=options, num_blocks=24, max_model_len=256) as server:
        collector = Collector(
            CollectorOptions(
                vllm_urls=[f"engine={server.url}"],
                kv_events=[f"tcp://127.0.0.1:{kv}"],
                kv_events_replay=[f"tcp://127.0.0.1:{replay}"],
                otlp_grpc=f"127.0.0.1:{otlp}",
                interval_s=0.5,
            ),
            store=store,
        )
        collector.start()
        try:
            wait_for(lambda: collector.scraper.num_scrapes >= 1)
            replies = [chat(server.url, s, turn) for turn in range(2) for s in sessions]
            before = collector.scraper.num_scrapes  # (counted as a scrape begins: two more, one of them whole)
            wait_for(lambda: collector.scraper.num_scrapes >= before + 2)  # a scrape after the last eviction
            server.shutdown()  # flushes the engine's spans and KV events
            wait_for(lambda: collector.span_ingest.num_requests == len(replies))
            scrapes = collector.scraper.num_scrapes
            wait_for(lambda: collector.scraper.num_scrapes >= scrapes + 1)
        finally:
            collector.stop()
    from kvobs.store.rows import run_id

    runs = store.reads.runs()  # the collector names the engine's run as the engine does (its start on /metrics)
    assert list(runs["run_id"]) == [run_id("engine", server.started_at)] and list(runs["num_blocks"]) == [23]
    assert list(runs["offload_blocks"]) == [0]  # its cache_config_info says no tier, as vLLM says it
    with store.session() as s:
        requests = s.scalars(select(RequestRow)).all()
        stored = s.execute(select(KVEventRow.session_id).where(KVEventRow.kind == "stored")).scalars().all()
        removed = s.execute(select(KVEventRow.session_id).where(KVEventRow.kind == "removed")).scalars().all()
        instance_rows = select(SnapshotRow).where(
            SnapshotRow.session_id.is_(None), SnapshotRow.blocks_total.is_not(None)
        )
        snapshot = s.scalars(instance_rows.order_by(SnapshotRow.id.desc())).first()
        gauges = set(s.scalars(select(MetricSampleRow.name)).all())
    assert sorted(r.session_id for r in requests) == sorted(sessions * 2)
    assert {r.request_id for r in requests} == {reply["id"] for reply in replies}
    by_id = {reply["id"]: reply for reply in replies}
    assert all(
        r.cached_tokens == by_id[r.request_id]["usage"]["prompt_tokens_details"]["cached_tokens"] for r in requests
    )
    assert set(stored) == set(sessions) and removed  # 23 usable blocks: sessions evict each other
    assert snapshot.blocks_total == 23 and snapshot.evictions_total >= len(removed) // 2
    assert {"kvobs_kv_cache_resident_blocks", "kvobs_kv_blocks_evicted:increase", "up"} <= gauges
