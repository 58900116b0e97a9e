"""A burst: 1,500 vLLM-format batches (187,500 block events) published at once, as vLLM's publisher (send
high-water mark 100,000) does after a busy second, to one collector writing to SQLite. Every event is stored or
counted as lost; none vanishes."""

from __future__ import annotations

from sqlalchemy import func, select

from collectors.collector import Collector, CollectorOptions
from kvobs.store import open_store
from kvobs.store.schema import KVEventRow
from kvobs.vllm import kv_events as wire
from tests.collectors.replay import publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for

BATCHES, HASHES = 1500, 125
VLLM_SNDHWM = 100_000


def _burst() -> list[tuple[bytes, bytes, bytes]]:
    frames = []
    for seq in range(BATCHES):
        hashes = [seq * HASHES + i + 1 for i in range(HASHES)]
        event = wire.BlockStored(
            block_hashes=hashes,
            parent_block_hash=None,
            token_ids=[],
            block_size=16,
            lora_id=None,
            medium="GPU",
            lora_name=None,
        )
        payload = wire.encode_batch(wire.KVEventBatch(ts=1000.0 + seq, events=[event]))
        frames.append((b"", wire.seq_bytes(seq), payload))
    return frames


def test_a_burst_is_stored_or_counted_never_silently_lost(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    port = free_port()
    collector = Collector(
        CollectorOptions(kv_events=[f"tcp://127.0.0.1:{port}"], kv_events_bind=True, interval_s=3600), store=store
    )
    frames = _burst()
    collector.start()
    try:
        with publisher(f"tcp://127.0.0.1:{port}", bind=False, hwm=VLLM_SNDHWM) as pub:
            wait_subscribed(pub)
            for message in frames:
                pub.send_multipart(message)
            sub = collector.streams[0].subscriber
            wait_for(lambda: sub.num_batches + sub.num_lost >= BATCHES, timeout_s=120)
    finally:
        collector.stop()
    with store.engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(KVEventRow)).scalar_one()
    sub = collector.streams[0].subscriber
    assert sub.num_batches + sub.num_lost == BATCHES
    assert stored == sub.num_batches * HASHES  # everything delivered was stored
    assert sub.num_lost == 0, f"{sub.num_lost} batches lost in a burst the publisher kept"
