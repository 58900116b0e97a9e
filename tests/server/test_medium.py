"""The tier a block lives in (`medium`), decided once by the block manager: the same on the ZMQ stream (read with
vLLM's strict decoder), on the spans and in the store, and the same as the real vLLM CPU build publishes."""

from __future__ import annotations

import httpx
import msgspec
import zmq
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import select

from kvobs.semconv import attributes as a
from kvobs.store import open_store
from kvobs.store.schema import KVEventRow
from kvobs.telemetry import TelemetryConfig, setup_telemetry
from kvobs.vllm import kv_events as wire
from tests.collectors.recorded import kv_messages
from tests.server.conftest import SERVED, free_port, receive_events, running_server


def _recorded_vllm_media() -> set[str | None]:
    decoder = msgspec.msgpack.Decoder(wire.KVEventBatch)
    return {
        event.medium
        for message in kv_messages()
        for event in decoder.decode(message.frames[-1]).events
        if isinstance(event, wire.BlockStored | wire.BlockRemoved)
    }


def test_a_cpu_engine_names_its_cache_tier_as_vllm_does_on_the_wire_in_spans_and_in_the_store(smollm2_source, tmp_path):
    assert _recorded_vllm_media() == {"GPU"}  # vLLM 0.32's CPU build: its primary cache is the GPU tier
    store_url, port = f"sqlite:///{tmp_path / 'kv.db'}", free_port()
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry(TelemetryConfig(service_name="kvobs-engine", span_exporters=[exporter], metrics=False))
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(f"tcp://127.0.0.1:{port}")
    options = {"kv_events_endpoint": f"tcp://*:{port}", "store_url": store_url, "instance": "cpu-engine"}
    try:
        with running_server(
            smollm2_source, num_blocks=12, max_model_len=160, options=options, telemetry=telemetry
        ) as server:
            assert server.engine.engine.runner.device.type == "cpu"
            for i in range(4):  # four distinct ~100-token prompts through 11 usable blocks: stores and evictions
                body = {
                    "model": SERVED,
                    "max_tokens": 2,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": " ".join(f"word{i}x{j}" for j in range(15))}],
                }
                assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
            published = [e for _, e in receive_events(sub)]
        telemetry.shutdown()
    finally:
        sub.close()
    stored = [e for e in published if isinstance(e, wire.BlockStored)]
    removed = [e for e in published if isinstance(e, wire.BlockRemoved)]
    assert stored and removed
    assert {e.medium for e in stored + removed} == {"GPU"}
    store = open_store(store_url)
    with store.engine.connect() as conn:
        rows = conn.execute(select(KVEventRow.kind, KVEventRow.medium)).all()
    store.close()
    assert {kind for kind, _ in rows} >= {"stored", "evicted"}
    assert {medium for _, medium in rows} == {"GPU"}
    media = {s.attributes[a.KV_MEDIUM] for s in exporter.get_finished_spans() if a.KV_MEDIUM in s.attributes}
    assert media == {"GPU"}
