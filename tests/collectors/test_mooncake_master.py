"""Mooncake Store master's KV events through the collector's door: the frames its publisher sends
(`tests/fixtures/mooncake-master/record.py`, from its source) decoded, then played by a real ZMQ publisher to a
real `kvobs collect`: each object's availability per medium stored as the pool's tier rows, the event its full
queue dropped counted as the gap it left, and nothing taken for vLLM's."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from kvobs.mooncake_store.normalize import SHAPE, key_hash
from kvobs.vllm.normalize import decode
from tests.collectors.replay import publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for

FRAMES = Path(__file__).parents[1] / "fixtures" / "mooncake-master" / "frames.jsonl"
LMCACHE_KEY = "vllm@SmolLM2-135M-Instruct@1@0@5ac1c0ffee"


def _frames() -> list[dict]:
    return [json.loads(line) for line in FRAMES.read_text().splitlines()]


def _said(frame: dict) -> list[tuple]:
    decoded = decode(bytes.fromhex(frame["payload"]))
    assert (decoded.shape, decoded.unknown, decoded.refused) == (SHAPE, 0, 0)
    return [(type(e).__name__, *getattr(e, "hashes", ()), getattr(e, "medium", None)) for e in decoded.batch.events]


def test_each_object_is_a_block_of_the_pool_s_tier_by_its_key():
    frames = _frames()
    assert [f["seq"] for f in frames] == [1, 2, 4, 5]  # 3: the dropped event's number
    lmcache = key_hash(LMCACHE_KEY)
    assert [_said(f) for f in frames] == [
        [
            ("Stored", 42, "REMOTE_CPU"),  # "0x2a"
            ("Stored", 12345, "REMOTE_CPU"),
            ("Stored", lmcache, "REMOTE_CPU"),  # committed to both media: stored on each
            ("Stored", lmcache, "REMOTE_DISK"),
        ],
        [("Stored", 42, "REMOTE_DISK"), ("Removed", 42, "REMOTE_CPU")],  # moved to disk
        [("Stored", 43, "REMOTE_CPU"), ("Stored", 44, "REMOTE_CPU"), ("Stored", 45, "REMOTE_CPU")],
        [("Cleared", None)],
    ]
    assert decode(bytes.fromhex(frames[0]["payload"])).batch.ts == 1796500000.1  # (its milliseconds, as seconds)


def test_a_key_is_the_u64_it_spells_else_its_digest():
    assert (key_hash("0x2A"), key_hash("12345"), key_hash(str(2**64 - 1))) == (42, 12345, 2**64 - 1)
    assert key_hash(str(2**64)) == key_hash(str(2**64)) != 2**64 % 2**64  # too large: hashed, and stable
    assert key_hash("a") != key_hash("b")


def test_the_collector_stores_the_pool_s_media_and_counts_the_dropped_event(store):
    port = free_port()
    frames = _frames()
    collector = Collector(CollectorOptions(kv_events=[f"mooncake-pool=tcp://127.0.0.1:{port}"]), store=store)
    with publisher(f"tcp://127.0.0.1:{port}", bind=True) as pub:
        collector.start()
        try:
            wait_subscribed(pub)
            for frame in frames:
                pub.send_multipart([b"", frame["seq"].to_bytes(8, "big"), bytes.fromhex(frame["payload"])])
            (stream,) = collector.streams
            wait_for(lambda: stream.subscriber.num_batches == len(frames))
            time.sleep(0.2)
        finally:
            collector.stop()
    exposed = generate_latest(collector.registry).decode()
    assert 'kvobs_collector_kv_event_batches_lost_total{instance="mooncake-pool"} 1.0' in exposed
    assert f'kvobs_collector_kv_wire_batches_total{{instance="mooncake-pool",shape="{SHAPE}"}} 4.0' in exposed
    events = store.reads.kv_events()
    stored = events[events["kind"] != "cleared"]
    rows = sorted(zip(stored["kind"], (int(h) for h in stored["block_hash"]), stored["medium"], strict=True))
    lmcache = key_hash(LMCACHE_KEY)
    assert rows == sorted(
        [
            *(("tier_stored", h, "REMOTE_CPU") for h in (42, 12345, lmcache, 43, 44, 45)),
            ("tier_stored", lmcache, "REMOTE_DISK"),
            ("tier_stored", 42, "REMOTE_DISK"),
            ("tier_removed", 42, "REMOTE_CPU"),  # its memory copy evicted: on disk alone
        ]
    )  # (12345's removal was the event the queue dropped: the gap says so, no row claims it)
    assert list(events["kind"])[-1] == "cleared" and (events["num_tokens"] == 0).all()  # (no block size said)
    assert not set(events["kind"]) & {"stored", "removed"}  # none taken for a replica's own cache
