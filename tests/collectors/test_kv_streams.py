"""A fleet per collector: several `--kv-events` streams, each its own instance with its own sequence numbers;
and the collector's memory: sessions idle past `--session-idle-s` are let go (counted)."""

from __future__ import annotations

import pytest

from collectors.collector import Collector, CollectorOptions
from collectors.kv.ingest import KVIngest
from collectors.kv.streams import KVStreamSpec, parse_streams
from kvobs.block_events import Batch
from kvobs.store import StoreWriter, open_store
from kvobs.vllm import kv_events as wire
from kvobs.vllm.normalize import normalize
from tests.collectors.recorded import kv_messages
from tests.collectors.replay import publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for


def test_streams_are_named_and_replays_paired():
    specs = parse_streams(["gpu-0=tcp://a:5557", "tcp://b:5557"], ["gpu-0=tcp://a:5558"])
    assert specs == [KVStreamSpec("gpu-0", "tcp://a:5557", "tcp://a:5558"), KVStreamSpec("b:5557", "tcp://b:5557")]
    assert parse_streams(["tcp://a:5557"], ["tcp://a:5558"], default_instance="vllm") == [
        KVStreamSpec("vllm", "tcp://a:5557", "tcp://a:5558")
    ]
    with pytest.raises(ValueError, match="unknown stream"):
        parse_streams(["gpu-0=tcp://a:5557"], ["gpu-9=tcp://a:5558"])
    with pytest.raises(ValueError, match="share an instance name"):
        parse_streams(["x=tcp://a:5557", "x=tcp://b:5557"], [])
    with pytest.raises(ValueError, match="unnamed"):
        parse_streams(["tcp://a:5557"], ["tcp://a:5558", "tcp://b:5558"])


def test_two_replicas_into_one_collector_each_tagged_with_its_instance(tmp_path):
    """The recorded stream from two publishers at once: each stream's rows carry its name, each has its own
    sequence (both start at 0: neither is a restart of the other) and the same counts."""
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    ports = [free_port(), free_port()]
    options = CollectorOptions(
        kv_events=[f"gpu-{i}=tcp://127.0.0.1:{p}" for i, p in enumerate(ports)], kv_events_bind=True, interval_s=3600
    )
    collector = Collector(options, store=store)
    collector.start()
    messages = kv_messages()
    try:
        with (
            publisher(f"tcp://127.0.0.1:{ports[0]}", bind=False) as a,
            publisher(f"tcp://127.0.0.1:{ports[1]}", bind=False) as b,
        ):
            wait_subscribed(a)
            wait_subscribed(b)
            for message in messages:
                a.send_multipart(message.frames)
                b.send_multipart(message.frames)
            wait_for(lambda: all(s.subscriber.num_batches == len(messages) for s in collector.streams))
    finally:
        collector.stop()
    events = store.reads.kv_events()
    per_instance = events.groupby("instance").size().to_dict()
    assert set(per_instance) == {"gpu-0", "gpu-1"} and per_instance["gpu-0"] == per_instance["gpu-1"] > 0
    for stream in collector.streams:
        assert (stream.subscriber.num_restarts, stream.subscriber.num_lost) == (0, 0)
    assert "KV events gpu-0: bind" in collector.describe() and "KV events gpu-1: bind" in collector.describe()


def _stored(ts: float, session: str | None, first_hash: int) -> Batch:
    return normalize(
        wire.KVEventBatch(
            ts=ts,
            events=[
                wire.BlockStored(
                    block_hashes=[first_hash, first_hash + 1],
                    parent_block_hash=None,
                    token_ids=[],
                    block_size=16,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    session_id=session,
                )
            ],
        )
    )


def _removed(ts: float, *hashes: int) -> Batch:
    return normalize(wire.KVEventBatch(ts=ts, events=[wire.BlockRemoved(block_hashes=list(hashes), medium="GPU")]))


def test_sessions_idle_past_the_limit_are_forgotten_and_a_returning_one_is_tracked_again(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    writer = StoreWriter(store)
    ingest = KVIngest(writer, instance="vllm", session_idle_s=100.0, settle_s=0.0)
    ingest.on_batch(0, _stored(0.0, "gone", 10))
    ingest.on_batch(1, _removed(1.0, 10, 11))  # nothing of "gone" is resident any more
    ingest.on_batch(2, _stored(5.0, "holding", 20))  # keeps two blocks cached
    ingest.on_batch(3, _stored(50.0, "recent", 30))
    ingest.on_batch(4, _removed(51.0, 30, 31))
    ingest.snapshot()
    assert ingest.num_sessions_forgotten == 0  # stream time 51: nobody idle for 100 s yet
    ingest.on_batch(5, _stored(120.0, "other", 40))
    ingest.snapshot()
    assert ingest.num_sessions_forgotten == 1 and "gone" not in ingest.chains.footprints  # idle 119 s, nothing held
    assert "holding" in ingest.chains.footprints  # its blocks are still cached: kept
    assert "recent" in ingest.chains.footprints  # idle 69 s
    ingest.on_batch(6, _stored(130.0, "gone", 50))  # it comes back: a fresh footprint
    ingest.snapshot()
    assert ingest.chains.footprints["gone"].resident == 2
    writer.close()
    assert set(store.reads.sessions()["session_id"]) == {"gone", "holding", "recent", "other"}
