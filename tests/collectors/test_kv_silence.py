"""The silent misconfiguration: vLLM and the collector both given the same concrete KV-event address both connect,
nobody binds, nothing arrives. With the replica's recorded /metrics counting prefix-cache queries, the collector
says so once, in a line naming the bind rule and the flag, and counts it; bound correctly, it never does."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from tests.collectors.recorded import kv_messages, scrapes
from tests.collectors.replay import metrics_server, publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for

SILENT = 'kvobs_collector_kv_streams_silent_total{instance="vllm"}'


def _serving_bodies() -> list[str]:
    """Scrapes from the middle of the recording, where vLLM's prefix-cache query counter rises scrape by scrape."""
    return [body for _, body in scrapes()[5:40]]


@pytest.mark.parametrize("bound", [False, True])
def test_a_kv_stream_that_hears_nothing_while_its_replica_serves_is_told_once(store, caplog, bound):
    port = free_port()
    with metrics_server(_serving_bodies()) as url:
        options = CollectorOptions(
            vllm_urls=[f"vllm={url}"],
            kv_events=[f"vllm=tcp://127.0.0.1:{port}"],
            kv_events_bind=bound,
            interval_s=0.2,
            kv_silence_s=1.0,
        )
        collector = Collector(options, store=store)
        collector.start()
        try:
            # vLLM given the same concrete address: it connects too (unless the collector bound it)
            with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub, caplog.at_level(logging.WARNING):
                if bound:
                    wait_subscribed(pub)
                deadline = time.monotonic() + 4.0
                messages = iter(kv_messages()[:200])
                while time.monotonic() < deadline:
                    collector.scraper.scrape_all()  # the replica serves: its query counter rises
                    pub.send_multipart(next(messages).frames)  # and publishes, into nowhere when nobody binds
                    time.sleep(0.05)
                if not bound:
                    wait_for(lambda: collector.kv_silence.num_silent["vllm"] >= 1, timeout_s=5)
                    time.sleep(1.0)  # more ticks of the same silence
        finally:
            collector.stop()
    told = [r.getMessage() for r in caplog.records if "KV events of vllm" in r.getMessage()]
    exposed = generate_latest(collector.registry).decode()
    if bound:
        assert collector.streams[0].subscriber.num_batches > 0 and not told
        assert f"{SILENT} 0.0" in exposed
    else:
        assert collector.streams[0].subscriber.num_batches == 0
        assert len(told) == 1 and "--kv-events-bind" in told[0] and "tcp://*:PORT" in told[0]
        assert "connects to that endpoint" in told[0]
        assert f"{SILENT} 1.0" in exposed  # once per silence, however many ticks it lasts


def test_a_silent_stream_without_a_scrape_of_its_replica_is_not_judged(store, caplog):
    """No /metrics to tell an idle replica from a misconfigured one: no warning, however long the silence."""
    port = free_port()
    collector = Collector(
        CollectorOptions(kv_events=[f"vllm=tcp://127.0.0.1:{port}"], interval_s=0.1, kv_silence_s=0.2), store=store
    )
    collector.start()
    try:
        with caplog.at_level(logging.WARNING):
            time.sleep(1.0)
    finally:
        collector.stop()
    assert not collector.kv_silence.check() and not [r for r in caplog.records if "KV events of" in r.getMessage()]
