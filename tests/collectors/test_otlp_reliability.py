"""The OTLP receiver under hostile input and overload (the reliability probe's F3, F6, F10, F15): a gzip bomb is
refused before it expands, a stalled or lying body frees its thread, gRPC garbage is INVALID_ARGUMENT and counted,
and an export the store cannot take now is answered 429 / RESOURCE_EXHAUSTED, never acknowledged and lost."""

from __future__ import annotations

import socket
import sqlite3
import time
import zlib

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import func, select

from collectors.traces import otlp_receiver as receiver_module
from collectors.traces.otlp_receiver import EXPORT_METHOD, MAX_BODY_BYTES, Busy, OTLPReceiver
from collectors.traces.span_ingest import SpanIngest
from kvobs.store import StoreWriter, open_store
from kvobs.store.schema import RequestRow
from tests.collectors.recorded import otlp_bodies
from tests.otlp import otlp_receiver

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _gzip_of_zeros(n_bytes: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * 2**20
    return b"".join(c.compress(chunk) for _ in range(n_bytes // len(chunk))) + c.flush()


def test_a_gzip_bomb_is_refused_with_413_before_it_expands():
    bomb = _gzip_of_zeros(MAX_BODY_BYTES + 2**20)  # 65 MiB of zeros in about 65 KB
    assert len(bomb) < 200_000
    with otlp_receiver() as (receiver, received):
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        r = httpx.post(url, content=bomb, headers={**PROTOBUF, "Content-Encoding": "gzip"}, timeout=30)
        good = httpx.post(url, content=otlp_bodies()[-1], headers=PROTOBUF)
    assert r.status_code == 413 and "limit" in r.text
    assert receiver.num_malformed == 1 and good.status_code == 200 and received.named("llm_request")


def _raw(port: int, request: bytes, wait_s: float) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            part = sock.recv(4096)
            if not part:
                break
            data += part
        return data


def test_a_stalled_body_gets_408_and_a_bad_content_length_400(monkeypatch):
    monkeypatch.setattr(receiver_module, "READ_TIMEOUT_S", 1.0)
    with otlp_receiver() as (receiver, _):
        port = receiver.http_port
        t0 = time.monotonic()
        stalled = _raw(port, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc", 10)
        waited = time.monotonic() - t0
        not_a_number = _raw(port, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 10)
        negative = _raw(port, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 10)
        after = httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=otlp_bodies()[-1], headers=PROTOBUF)
    assert stalled.startswith(b"HTTP/1.1 408") and waited < 8
    assert not_a_number.startswith(b"HTTP/1.1 400") and negative.startswith(b"HTTP/1.1 400")
    assert after.status_code == 200


def test_grpc_garbage_is_invalid_argument_and_counted():
    with otlp_receiver() as (receiver, received), grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as ch:
        export = ch.unary_unary(EXPORT_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as garbage:
            export(b"\xff\xfe\x00 not protobuf" * 10, timeout=10)
        export(otlp_bodies()[-1], timeout=10)
    assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert receiver.num_malformed == 1 and received.named("llm_request")


def test_busy_is_429_with_retry_after_over_http_and_resource_exhausted_with_retry_info_over_grpc():
    def handle(_request):
        raise Busy("full", retry_after_s=3)

    receiver = OTLPReceiver(handle, grpc_address="127.0.0.1:0", http_address="127.0.0.1:0")
    receiver.start()
    try:
        r = httpx.post(f"http://127.0.0.1:{receiver.http_port}/v1/traces", content=otlp_bodies()[-1], headers=PROTOBUF)
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            export = channel.unary_unary(
                EXPORT_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            with pytest.raises(grpc.RpcError) as refused:
                export(otlp_bodies()[-1], timeout=10)
    finally:
        receiver.stop()
    assert r.status_code == 429 and r.headers["retry-after"] == "3"
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = dict(refused.value.trailing_metadata())["grpc-status-details-bin"]
    info = error_details_pb2.RetryInfo()
    status_pb2.Status.FromString(details).details[0].Unpack(info)
    assert info.retry_delay.seconds == 3 and receiver.num_busy == 2 and receiver.num_handler_errors == 0


def _llm_spans(request: ExportTraceServiceRequest) -> int:
    return sum(s.name == "llm_request" for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)


def _until_acknowledged(url: str, export: ExportTraceServiceRequest, writer: StoreWriter) -> bool:
    """What an OTLP exporter does with 429: wait (here: until the writer drained) and send the same export again."""
    for _ in range(20):
        r = httpx.post(url, content=export.SerializeToString(), headers=PROTOBUF)
        if r.status_code == 200:
            return True
        assert r.status_code == 429
        writer.flush(30)
    return False


def test_an_export_the_store_queue_cannot_take_is_not_acknowledged_and_stored_once_on_retry(tmp_path):
    """The probe's F6: a full writer queue used to answer 200 and drop the spans. The store is held by another
    connection (a real SQLite lock), so the writer cannot drain and its queue fills."""
    path = tmp_path / "kvobs.db"
    store = open_store(f"sqlite:///{path}")
    exports = [ExportTraceServiceRequest.FromString(b) for b in otlp_bodies()]
    exports = [e for e in exports if _llm_spans(e)]
    sizes = [_llm_spans(e) for e in exports]
    writer = StoreWriter(store, max_queue=sizes[0] + sizes[1] - 1, max_backoff_s=0.2)
    ingest = SpanIngest(writer)
    receiver = OTLPReceiver(ingest.handle, grpc_address=None, http_address="127.0.0.1:0")
    receiver.start()
    url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
    holder = sqlite3.connect(path, timeout=0)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        first = httpx.post(url, content=exports[0].SerializeToString(), headers=PROTOBUF)
        second = httpx.post(url, content=exports[1].SerializeToString(), headers=PROTOBUF)
        assert (first.status_code, second.status_code) == (200, 429)
        assert ingest.num_requests == sizes[0]  # the refused export left nothing behind
    finally:
        holder.rollback()
        holder.close()
    assert writer.flush(30)
    retried = [_until_acknowledged(url, e, writer) for e in exports[1:]]
    receiver.stop()
    writer.close()
    with store.session() as s:
        stored = s.scalar(select(func.count()).select_from(RequestRow))
    store.close()
    assert all(retried) and stored == sum(sizes) == ingest.num_requests
    assert writer.num_dropped == 0  # refused is not dropped: the exporter still held them


def test_the_start_line_names_only_the_listeners_that_are_on(tmp_path):
    """It read `OTLP gRPC :None HTTP :4318` with gRPC off."""
    from collectors.collector import Collector, CollectorOptions

    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    collector = Collector(CollectorOptions(otlp_http="127.0.0.1:0", interval_s=3600), store=store)
    collector.start()
    try:
        line = collector.describe()
    finally:
        collector.stop()
        store.close()
    assert line == f"OTLP HTTP :{collector.receiver.http_port}" and "None" not in line
