"""The silent misconfiguration: vLLM and the collector both given the same concrete KV-event address both connect,
nobody binds, nothing arrives. With the replica's recorded /metrics counting prefix-cache queries, the collector
says so once, in a line naming the bind rule and the flag, and counts it; bound correctly, it never does."""

from __future__ import annotations

import logging
import threading
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
        assert "enable_kv_cache_events true in --kv-events-config" in told[0]  # the other reason nothing arrives
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


def _rising_bodies(n: int) -> list[str]:
    """`n` recorded scrapes, each counting more prefix-cache queries than the one before (the replica serving)."""
    from prometheus_client.parser import text_string_to_metric_families

    def queries(body: str) -> float:
        return sum(
            s.value
            for f in text_string_to_metric_families(body)
            for s in f.samples
            if s.name == "vllm:prefix_cache_queries_total"
        )

    kept: list[tuple[float, str]] = []
    for _, body in scrapes():
        if queries(body) > (kept[-1][0] if kept else 0.0):
            kept.append((queries(body), body))
    assert len(kept) >= n, len(kept)
    return [body for _, body in kept[:n]]


def _ticked_collector(store, url: str, port: int, silence_s: float) -> Collector:
    """A started collector bound to the stream at `port`, scraping `url`; its own interval an hour, so the test
    drives it tick by tick."""
    options = CollectorOptions(
        vllm_urls=[f"vllm={url}"],
        kv_events=[f"vllm=tcp://127.0.0.1:{port}"],
        kv_events_bind=True,
        interval_s=3600,
        kv_silence_s=silence_s,
    )
    collector = Collector(options, store=store)
    collector.start()
    return collector


def test_a_stream_quiet_because_its_replica_stopped_serving_is_not_silent(store, caplog):
    """The agent stops: the stream's last batch comes with the last requests, and the scrape after it still sees
    their lookups counted (the scrape comes later than the blocks' events). From then on the stream and the counter
    are both quiet, for far longer than `--kv-silence-s`: nothing is told (before, the watch told a silence once the
    last batch was `--kv-silence-s` old, since the queries had risen after it). The collector is driven tick by
    tick (its own interval an hour), so the scrape after the last batch comes half the silence later."""
    port, silence_s, serving = free_port(), 1.0, 8
    bodies = _rising_bodies(serving + 2)
    with metrics_server([*bodies, *[bodies[-1]] * 200]) as url:
        collector = _ticked_collector(store, url, port, silence_s)
        told: list[str] = []
        try:
            with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub, caplog.at_level(logging.WARNING):
                wait_subscribed(pub)
                wait_for(lambda: collector.scraper.num_scrapes >= 1)  # the scraper thread's first round
                subscriber = collector.streams[0].subscriber
                for i, message in enumerate(kv_messages()[:serving]):  # the agent's steps: events, then counters
                    pub.send_multipart(message.frames)
                    wait_for(lambda i=i: subscriber.num_batches > i)
                    time.sleep(0.1)
                    collector.scraper.scrape_all()
                    told += collector.kv_silence.check()
                time.sleep(silence_s / 2)  # the agent stopped; the next scrape still sees its last lookups
                collector.scraper.scrape_all()
                rose = collector.scraper.queries_rose_at["vllm"]
                assert rose - subscriber.last_batch_at >= silence_s / 2  # the counter rose after the last batch
                stop = time.monotonic() + 3 * silence_s
                while time.monotonic() < stop:  # both quiet, well past the silence
                    collector.scraper.scrape_all()
                    told += collector.kv_silence.check()
                    time.sleep(0.1)
                assert collector.scraper.queries_rose_at["vllm"] == rose  # nothing served since
        finally:
            collector.stop()
    assert subscriber.num_batches == serving and not told
    assert not [r for r in caplog.records if "KV events of vllm" in r.getMessage()]
    assert f"{SILENT} 0.0" in generate_latest(collector.registry).decode()


def test_a_stream_busy_storing_a_batch_is_not_silent(store, caplog):
    """A slow store: the stream's thread is inside a batch's handling for twice `--kv-silence-s` while the
    replica's counter rises scrape by scrape, and the batches behind it wait in the socket. Nothing arrives in
    that time, but the stream is busy, not deaf: nothing is told (before, a loaded CI machine saw a bound stream
    called silent this way). Once the store lets go, the waiting batches are delivered."""
    port, silence_s, sent = free_port(), 0.5, 4
    with metrics_server(_rising_bodies(20)) as url:
        collector = _ticked_collector(store, url, port, silence_s)
        subscriber = collector.streams[0].subscriber
        stored, release = subscriber.handle, threading.Event()

        def slow_store(seq, batch):
            release.wait(30)
            stored(seq, batch)

        subscriber.handle = slow_store
        told: list[str] = []
        try:
            with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub, caplog.at_level(logging.WARNING):
                wait_subscribed(pub)
                for message in kv_messages()[:sent]:
                    pub.send_multipart(message.frames)
                wait_for(lambda: subscriber.handling_since is not None)
                stop = time.monotonic() + 2 * silence_s
                while time.monotonic() < stop:
                    collector.scraper.scrape_all()
                    told += collector.kv_silence.check()
                    time.sleep(0.1)
                rose = collector.scraper.queries_rose_at["vllm"]
                assert rose - subscriber.last_batch_at >= silence_s  # the replica served on while nothing arrived
                release.set()
                wait_for(lambda: subscriber.num_batches == sent)
                told += collector.kv_silence.check()
        finally:
            release.set()
            collector.stop()
    assert not told and not [r for r in caplog.records if "KV events of vllm" in r.getMessage()]
    assert f"{SILENT} 0.0" in generate_latest(collector.registry).decode()
