"""What the fixture recorders (tests/fixtures/*/record.py) share: a real vLLM started by `scripts/vllm-cpu.sh`, a
ZMQ subscriber that keeps every frame as received, a /metrics scraper, and the layout they write:

    kv_events.jsonl      one ZMQ message a line: its receive time and its frames, base64
    metrics/             `GET /metrics` bodies, `scrape_NNN.txt`, and `index.json` (each file's scrape time)
    otlp_traces.jsonl    one OTLP export body a line (protobuf, base64)
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import zmq

ROOT = Path(__file__).resolve().parents[1]
VLLM_SCRIPT = ROOT / "scripts" / "vllm-cpu.sh"


def start_vllm(venv: str, port: int, args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """A real vLLM (`scripts/vllm-cpu.sh serve VENV PORT ARGS`) with `env` over this one, its output in `log_path`;
    returned once it answers `/v1/models`."""
    with open(log_path, "w") as log:  # the child holds its own descriptor
        proc = subprocess.Popen(
            ["bash", str(VLLM_SCRIPT), "serve", venv, str(port), *args],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_vllm(f"http://127.0.0.1:{port}", proc)
    return proc


def wait_vllm(url: str, proc: subprocess.Popen, timeout_s: float = 1200.0) -> None:
    """Until vLLM at `url` answers (its first start compiles the model: minutes on 2 cores)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM at {url} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2.0)
    raise RuntimeError(f"vLLM at {url} did not start in {timeout_s:.0f} s")


def otlp_recorder():
    """A started OTLP receiver (gRPC and HTTP on free ports) that keeps every export body, base64; (it, bodies)."""
    from collectors.traces.otlp_receiver import OTLPReceiver

    bodies: list[str] = []
    receiver = OTLPReceiver(
        lambda request: bodies.append(base64.b64encode(request.SerializeToString()).decode()) or 0,
        grpc_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
    )
    receiver.start()
    return receiver, bodies


def run_agents(urls: list[str], otlp_grpc_port: int, workload: str, timeout_s: float) -> None:
    """`kvobs agents` round robin over the replicas at `urls`, its spans to the recorder, no store."""
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "agents", *(a for url in urls for a in ("--base-url", url))]
        + ["--routing", "round_robin", "--no-store", "--otlp-endpoint", f"http://127.0.0.1:{otlp_grpc_port}"]
        + ["--no-progress", *workload.split()],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    print(done.stdout[-2000:], done.stderr[-2000:])
    assert done.returncode == 0, done.stderr


def subscribe(endpoint: str, out: list[dict], stop: threading.Event, *, bind: bool = False) -> None:
    """Every multipart message at `endpoint` (connected, or bound: vLLM connects to a concrete address) until
    `stop`, with its receive time, base64."""
    sock = _subscriber(endpoint, bind=bind)
    for _ in _messages(sock, out, stop):
        pass
    sock.close(linger=0)


def relay(endpoint: str, onward: str, out: list[dict], stop: threading.Event) -> None:
    """Bind `endpoint` (vLLM connects to it), keep every message as `subscribe` does, and publish it unchanged on
    `onward` (bound) for a collector to subscribe to: a recording of the stream the collector reads."""
    sub, pub = _subscriber(endpoint, bind=True), zmq.Context.instance().socket(zmq.PUB)
    pub.bind(onward)
    for parts in _messages(sub, out, stop):
        pub.send_multipart(parts)
    sub.close(linger=0)
    pub.close(linger=0)


def _subscriber(endpoint: str, *, bind: bool) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 200)
    (sock.bind if bind else sock.connect)(endpoint)
    return sock


def _messages(sock: zmq.Socket, out: list[dict], stop: threading.Event) -> Iterator[list[bytes]]:
    """Each message until `stop`, kept in `out` with its receive time (base64) as it is yielded."""
    while not stop.is_set():
        try:
            parts = sock.recv_multipart()
        except zmq.Again:
            continue
        out.append({"recv_ts": time.time(), "frames_b64": [base64.b64encode(p).decode() for p in parts]})
        yield parts


def scrape(url: str, out: list[tuple[float, str]], stop: threading.Event, every_s: float = 1.0) -> None:
    """`GET url/metrics` every `every_s` until `stop` or the server stops."""
    while not stop.wait(every_s):
        try:
            out.append((time.time(), httpx.get(url + "/metrics", timeout=5).text))
        except httpx.HTTPError:
            return


def scrub_paths(body: str, prefixes: dict[str, str]) -> str:
    """An OTLP body (base64 protobuf) with every string attribute starting with a prefix of this machine (an
    install path in a server's startup spans: `code.filepath`) rewritten to its stand-in, nothing else changed."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(base64.b64decode(body))
    for resource_spans in request.resource_spans:
        groups = [resource_spans.resource.attributes]
        groups += [span.attributes for scope in resource_spans.scope_spans for span in scope.spans]
        for attributes in groups:
            for attribute in attributes:
                for prefix, stand_in in prefixes.items():
                    if attribute.value.string_value.startswith(prefix):
                        value = attribute.value.string_value
                        attribute.value.string_value = stand_in + value[len(prefix) :]
    return base64.b64encode(request.SerializeToString()).decode()


def write_recording(
    here: Path, frames: dict[str, list[dict]], scrapes: dict[str, list[tuple[float, str]]], bodies: list[str]
) -> None:
    """Each replica's `kv_events.jsonl` and `metrics/` (scrapes with `index.json`), and every OTLP body."""
    for name in frames:
        folder = here / name / "metrics"
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("scrape_*.txt"):  # an earlier recording's, which this one may not overwrite
            old.unlink()
        (here / name / "kv_events.jsonl").write_text("".join(json.dumps(f) + "\n" for f in frames[name]))
        index = []
        for i, (ts, body) in enumerate(scrapes[name]):
            (folder / f"scrape_{i:03d}.txt").write_text(body)
            index.append({"ts": ts, "file": f"scrape_{i:03d}.txt"})
        (folder / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    kind = {"path": "/v1/traces", "content_type": "application/x-protobuf"}
    (here / "otlp_traces.jsonl").write_text("".join(json.dumps({**kind, "body_b64": b}) + "\n" for b in bodies))
