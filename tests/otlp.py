"""A real OTLP receiver in-process, and the spans it received flattened for assertions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from collectors.traces.otlp_receiver import OTLPReceiver
from collectors.traces.span_ingest import attributes as _attrs


@dataclass
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict
    events: list[tuple[str, dict]]
    links: list[tuple[str, str, dict]]  # (trace id, span id, attributes)
    status_code: int
    start_ns: int
    end_ns: int


@dataclass
class Received:
    spans: list[Span] = field(default_factory=list)
    requests: list = field(default_factory=list)  # the export requests as received
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, request) -> None:
        self.requests.append(request)
        flat = []
        for rs in request.resource_spans:
            service = _attrs(rs.resource.attributes).get("service.name", "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    flat.append(
                        Span(
                            service,
                            s.name,
                            s.kind,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            _attrs(s.attributes),
                            [(e.name, _attrs(e.attributes)) for e in s.events],
                            [(ln.trace_id.hex(), ln.span_id.hex(), _attrs(ln.attributes)) for ln in s.links],
                            s.status.code,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                        )
                    )
        with self.lock:
            self.spans.extend(flat)

    def named(self, prefix: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == prefix or s.name.startswith(prefix + " ")]


@contextmanager
def otlp_receiver() -> Iterator[tuple[OTLPReceiver, Received]]:
    received = Received()
    receiver = OTLPReceiver(received.handle, grpc_address="127.0.0.1:0", http_address="127.0.0.1:0")
    receiver.start()
    try:
        yield receiver, received
    finally:
        receiver.stop()
