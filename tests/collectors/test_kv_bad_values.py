"""The reliability probe's F2 and F5 on the KV-event path, through a real collector and real ZMQ sockets: one event
with a value no store column can hold is refused alone (its batch and the writer's batch go on), and a 1 MB session
id is cut before it reaches a row."""

from __future__ import annotations

from sqlalchemy import func, select

from collectors.collector import Collector, CollectorOptions
from kvobs.semconv.limits import MAX_ID_BYTES
from kvobs.store import open_store
from kvobs.store.schema import KVEventRow, SessionRow
from kvobs.vllm import kv_events as wire
from tests.collectors.replay import publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for


def _stored(h: int, block_size: int = 16, session: str | None = "s") -> wire.BlockStored:
    return wire.BlockStored(
        block_hashes=[h],
        parent_block_hash=None,
        token_ids=[],
        block_size=block_size,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id=session,
    )


def test_one_out_of_range_event_takes_no_good_rows_with_it(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    port = free_port()
    collector = Collector(
        CollectorOptions(kv_events=[f"tcp://127.0.0.1:{port}"], kv_events_bind=True, interval_s=3600), store=store
    )
    long_session = "x" * 1_000_000
    batches = [[_stored(seq + 1)] for seq in range(50)]
    batches.append([_stored(999, block_size=2**63), _stored(1000)])  # the poison beside a good event
    batches.append([_stored(2000, session=long_session), _stored(2001, session=long_session)])
    collector.start()
    try:
        with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub:
            wait_subscribed(pub)
            for seq, events in enumerate(batches):
                payload = wire.encode_batch(wire.KVEventBatch(1000.0 + seq, events))
                pub.send_multipart([b"", wire.seq_bytes(seq), payload])
            sub = collector.streams[0].subscriber
            wait_for(lambda: sub.num_batches >= len(batches), timeout_s=30)
    finally:
        collector.stop()
    with store.engine.connect() as conn:
        hashes = set(conn.execute(select(KVEventRow.block_hash)).scalars())
        sessions = set(conn.execute(select(SessionRow.session_id)).scalars())
        longest = conn.execute(select(func.max(func.length(KVEventRow.session_id)))).scalar_one()
    store.close()
    assert hashes == {*range(1, 51), 1000, 2000, 2001}  # 53 good rows; only the poison is missing
    assert collector.drops.get("kv_events", "bad_event") == 1 and collector.writer.num_dropped == 0
    assert longest == MAX_ID_BYTES and len(sessions) == 2 and collector.streams[0].ingest.num_ids_cut == 2
