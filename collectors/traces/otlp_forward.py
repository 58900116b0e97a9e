"""Pass every received OTLP trace export on, unchanged, to another OTLP endpoint (Jaeger, an OTel Collector).

    forwarder = OTLPForwarder("http://jaeger:4318", drops)     # or grpc://jaeger:4317
    forwarder.start(); receiver = OTLPReceiver(lambda r: (ingest.handle(r), forwarder.forward(r)), ...)
    forwarder.close()                                         # sends what is queued first

Exports wait in a bounded queue; one thread sends them (OTLP/HTTP protobuf to `<url>/v1/traces`, or the
gRPC TraceService), retrying a failed send 3 times with backoff. Exports it could not send, or that found
the queue full, are counted in `drops` under `otlp_forward`: receiving never waits on the next hop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from urllib.parse import urlsplit

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.drops import DropCounter
from collectors.traces.otlp_receiver import PROTOBUF, TRACES_PATH

log = logging.getLogger(__name__)

COMPONENT = "otlp_forward"
ATTEMPTS = 3
TIMEOUT_S = 10.0


def check_forward_url(url: str):
    """Raises ValueError unless `url` is http(s)://host:port[/path] or grpc://host:port."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "grpc") or not parts.netloc:
        raise ValueError(f"--forward-otlp needs http(s)://host:port[/v1/traces] or grpc://host:port; got {url!r}")
    return parts


class OTLPForwarder:
    def __init__(self, url: str, drops: DropCounter, *, max_queue: int = 10_000) -> None:
        parts = check_forward_url(url)
        self.url = url
        self.drops = drops
        self.num_forwarded = 0
        self._grpc_target = parts.netloc if parts.scheme == "grpc" else None
        has_path = bool(parts.path.rstrip("/"))
        self._http_url = None if self._grpc_target else url.rstrip("/") + ("" if has_path else TRACES_PATH)
        self._queue: queue.Queue[ExportTraceServiceRequest | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="kvobs-otlp-forward", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def forward(self, request: ExportTraceServiceRequest) -> None:
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            self.drops.count(COMPONENT, "queue_full")

    def close(self, timeout_s: float = 15.0) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)

    def _run(self) -> None:
        send = self._grpc_sender() if self._grpc_target else self._http_sender()
        while (request := self._queue.get()) is not None:
            for attempt in range(ATTEMPTS):
                try:
                    send(request)
                    self.num_forwarded += 1
                    break
                except (httpx.HTTPError, grpc.RpcError, RuntimeError) as exc:
                    if attempt == ATTEMPTS - 1:
                        self.drops.count(COMPONENT, "export_failed", f"{self.url}: {exc}"[:300])
                    else:
                        time.sleep(0.5 * 2**attempt)

    def _http_sender(self):
        client = httpx.Client(timeout=TIMEOUT_S)

        def send(request: ExportTraceServiceRequest) -> None:
            response = client.post(
                self._http_url, content=request.SerializeToString(), headers={"Content-Type": PROTOBUF}
            )
            if response.status_code >= 300:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")

        return send

    def _grpc_sender(self):
        stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(self._grpc_target))

        def send(request: ExportTraceServiceRequest) -> None:
            stub.Export(request, timeout=TIMEOUT_S)

        return send
