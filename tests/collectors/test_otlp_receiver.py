"""The OTLP receiver: vLLM's recorded exports decode; garbage is refused with 4xx and counted; gRPC works."""

from __future__ import annotations

import gzip

import grpc
import httpx
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.collectors.recorded import otlp_bodies as recorded_bodies
from tests.otlp import otlp_receiver


def test_vllm_recorded_exports_are_received_over_http():
    bodies = recorded_bodies()
    with otlp_receiver() as (receiver, received):
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        for body in bodies:
            r = httpx.post(url, content=body, headers={"Content-Type": "application/x-protobuf"})
            assert r.status_code == 200
    llm = received.named("llm_request")
    assert receiver.num_received == len(bodies) and receiver.num_malformed == 0
    assert llm and all(s.service == "vllm" and "gen_ai.latency.time_to_first_token" in s.attributes for s in llm)


def test_json_and_grpc_exports_are_received():
    request = ExportTraceServiceRequest()
    request.ParseFromString(recorded_bodies()[-1])
    with otlp_receiver() as (receiver, received):
        r = httpx.post(
            f"http://127.0.0.1:{receiver.http_port}/v1/traces",
            content=json_format.MessageToJson(request),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
    names = [s.name for s in received.spans]
    assert len(names) == 2 * sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def test_bad_bodies_get_4xx_are_counted_and_the_receiver_keeps_serving():
    with otlp_receiver() as (receiver, received):
        base = f"http://127.0.0.1:{receiver.http_port}"
        garbage = httpx.post(
            base + "/v1/traces",
            content=b"\xff\x00 not protobuf \x13\x37",
            headers={"Content-Type": "application/x-protobuf"},
        )
        bad_json = httpx.post(base + "/v1/traces", content=b"{not json", headers={"Content-Type": "application/json"})
        wrong_type = httpx.post(base + "/v1/traces", content=b"x", headers={"Content-Type": "text/html"})
        wrong_path = httpx.post(base + "/v1/logs", content=b"", headers={"Content-Type": "application/x-protobuf"})
        good = httpx.post(
            base + "/v1/traces", content=recorded_bodies()[-1], headers={"Content-Type": "application/x-protobuf"}
        )
    assert (garbage.status_code, bad_json.status_code) == (400, 400) and "not an OTLP" in garbage.text
    assert (wrong_type.status_code, wrong_path.status_code, good.status_code) == (415, 404, 200)
    assert receiver.num_malformed == 2 and received.named("llm_request")


def test_gzip_bodies_are_accepted_and_broken_gzip_is_refused():
    body = recorded_bodies()[-1]
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    with otlp_receiver() as (receiver, received):
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        ok = httpx.post(url, content=gzip.compress(body), headers=headers)
        broken = httpx.post(url, content=gzip.compress(body)[:-12], headers=headers)
    assert (ok.status_code, broken.status_code) == (200, 400) and receiver.num_malformed == 1
    assert received.named("llm_request")
