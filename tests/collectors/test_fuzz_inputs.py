"""A seeded fuzz of the collector's three inputs through one real collector: garbage KV-event messages between valid
batches (ZMQ), garbage OTLP bodies between valid exports (HTTP), garbage /metrics bodies between recorded vLLM scrapes.
The collector never answers 5xx, every valid item sent around the garbage is stored, and the garbage is counted."""

from __future__ import annotations

import os
import random

import httpx
import msgspec
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import select

from collectors.collector import Collector, CollectorOptions
from kvobs.store import open_store
from kvobs.store.schema import KVEventRow, RequestRow, SnapshotRow
from kvobs.vllm import kv_events as wire
from tests.collectors.recorded import otlp_bodies, scrapes
from tests.collectors.replay import metrics_server, publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for

SEED = int(os.environ.get("KVOBS_FUZZ_SEED", "20261123"))
MESSAGES = int(os.environ.get("KVOBS_FUZZ_REQUESTS", "300"))
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _flip(rng: random.Random, data: bytes) -> bytes:
    raw = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    return bytes(raw)


def _junk(rng: random.Random) -> object:
    return rng.choice(
        [
            None,
            -1,
            2**64 - 1,
            1.5,
            float("nan"),
            "x" * rng.randint(0, 300),
            b"\xc1",
            [],
            {},
            [1.0, [{"type": "BlockStored", "block_hashes": "abc"}], 0],
            {"ts": 1},
        ]
    )


def _kv_garbage(rng: random.Random, seq: int, valid: bytes) -> list[bytes]:
    kind = rng.randrange(5)
    if kind == 0:
        return [b"", wire.seq_bytes(seq)]  # two frames
    if kind == 1:
        return [b"", os.urandom(rng.randint(0, 12)), valid]  # a sequence frame that is not 8 bytes
    if kind == 2:
        return [b"", wire.seq_bytes(seq), os.urandom(rng.randint(0, 200))]
    if kind == 3:
        return [b"", wire.seq_bytes(seq), msgspec.msgpack.encode(_junk(rng))]
    return [b"", wire.seq_bytes(seq), _flip(rng, valid)]


def _stored_batch(h: int) -> bytes:
    event = wire.BlockStored(
        block_hashes=[h],
        parent_block_hash=None,
        token_ids=[1, 2],
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id=f"s{h % 7}",
    )
    return wire.encode_batch(wire.KVEventBatch(1.7e9 + h, [event]))


def _otlp_garbage(rng: random.Random, valid: bytes) -> tuple[bytes, dict]:
    kind = rng.randrange(5)
    if kind == 0:
        return os.urandom(rng.randint(1, 500)), PROTOBUF
    if kind == 1:
        return valid[: rng.randrange(len(valid))], PROTOBUF
    if kind == 2:
        return _flip(rng, valid), PROTOBUF
    if kind == 3:
        return msgspec.json.encode(_junk(rng) if rng.random() < 0.5 else {"resourceSpans": _junk(rng)}), {
            "Content-Type": "application/json"
        }
    return os.urandom(64), {**PROTOBUF, "Content-Encoding": "gzip"}


def _unique_export(base: ExportTraceServiceRequest, i: int) -> tuple[bytes, set[str]]:
    export = ExportTraceServiceRequest()
    export.CopyFrom(base)
    ids = set()
    for rs in export.resource_spans:
        for ss in rs.scope_spans:
            for j, span in enumerate(ss.spans):
                span.span_id = (i * 1000 + j + 1).to_bytes(8, "big")
                for kv in span.attributes:
                    if kv.key == "gen_ai.request.id":
                        kv.value.string_value = f"fuzz-{i}-{j}"
                if span.name == "llm_request":
                    ids.add(span.span_id.hex())
    return export.SerializeToString(), ids


def test_garbage_on_every_input_is_counted_and_every_valid_item_around_it_is_stored(tmp_path):
    rng = random.Random(SEED)
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    kv_port = free_port()
    bodies = [body for _, body in scrapes()][:12]
    responses = [
        b if i % 2 == 0 else rng.choice(["<html>", "\x00" * 100, "x 1 2 3\n", b[: len(b) // 3], b.replace(" ", "")])
        for i, b in enumerate(bodies)
    ]
    base = next(ExportTraceServiceRequest.FromString(b) for b in reversed(otlp_bodies()) if b"llm_request" in b)
    with metrics_server(responses) as metrics_url:
        collector = Collector(
            CollectorOptions(
                kv_events=[f"tcp://127.0.0.1:{kv_port}"],
                kv_events_bind=True,
                otlp_http="127.0.0.1:0",
                vllm_urls=[f"vllm={metrics_url}"],
                interval_s=3600,
            ),
            store=store,
        )
        collector.start()
        try:
            valid_hashes, valid_spans, seq, statuses = set(), set(), 0, []
            with publisher(f"tcp://127.0.0.1:{kv_port}", bind=False) as pub:
                wait_subscribed(pub)
                for i in range(MESSAGES):
                    h = i + 1
                    if rng.random() < 0.4:
                        frames = _kv_garbage(rng, seq, _stored_batch(10**6 + h))
                        if len(frames) == 3 and len(frames[1]) == 8:
                            seq += 1  # a well-numbered message with a bad payload still takes its number
                        pub.send_multipart(frames)
                    pub.send_multipart([b"", wire.seq_bytes(seq), _stored_batch(h)])
                    valid_hashes.add(h)
                    seq += 1
                sub = collector.streams[0].subscriber
                wait_for(lambda: sub.num_batches >= len(valid_hashes), timeout_s=60)
            url = f"http://127.0.0.1:{collector.receiver.http_port}/v1/traces"
            for i in range(MESSAGES // 3):
                if rng.random() < 0.5:
                    body, headers = _otlp_garbage(rng, base.SerializeToString())
                    statuses.append(httpx.post(url, content=body, headers=headers).status_code)
                body, ids = _unique_export(base, i)
                statuses.append(httpx.post(url, content=body, headers=PROTOBUF).status_code)
                valid_spans |= ids
            for _ in responses:
                collector.scraper.scrape_all()
        finally:
            collector.stop()
    with store.session() as s:
        hashes = set(s.scalars(select(KVEventRow.block_hash).where(KVEventRow.kind == "stored")))
        spans = set(s.scalars(select(RequestRow.span_id)))
        snapshots = len(s.scalars(select(SnapshotRow.id).where(SnapshotRow.session_id.is_(None))).all())
    store.close()
    assert valid_hashes <= hashes and valid_spans <= spans
    assert all(s < 500 for s in statuses) and snapshots == len(bodies[::2])
    dropped = collector.dropped_totals()
    assert dropped["kv_events"] > 0 and dropped["otlp"] > 0 and dropped["scrape"] > 0
    # a bit-flipped export can still parse, as a copy of a stored request: the store refuses that row alone
