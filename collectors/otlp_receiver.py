"""An OTLP trace receiver: the TraceService over gRPC and over HTTP/protobuf (JSON accepted too).

    receiver = OTLPReceiver(handle, grpc_address="0.0.0.0:4317", http_address="0.0.0.0:4318")
    receiver.start()                 # handle(ExportTraceServiceRequest) runs for every export, on a server thread
    receiver.grpc_port, receiver.http_port
    receiver.stop()

A body that is not an export request gets HTTP 400 (gRPC INVALID_ARGUMENT), is counted in `num_malformed`,
and the receiver keeps serving. A handler that raises answers 500 (gRPC INTERNAL) and is counted in
`num_handler_errors`; the exporter on the other side retries, as OTLP prescribes.
"""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvobs.logs import worth_logging

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 64 * 1024 * 1024
GRPC_WORKERS = 4

Handler = Callable[[ExportTraceServiceRequest], None]


class OTLPReceiver:
    """Receive OTLP trace exports on gRPC and/or HTTP.

    Args:
        handle: called with every well-formed export request.
        grpc_address: `host:port` for the gRPC TraceService (port 0 picks one; None: off).
        http_address: `host:port` for `POST /v1/traces` (port 0 picks one; None: off).
    """

    def __init__(self, handle: Handler, *, grpc_address: str | None = "127.0.0.1:4317",
                 http_address: str | None = "127.0.0.1:4318") -> None:  # fmt: skip
        if grpc_address is None and http_address is None:
            raise ValueError("an OTLP receiver needs a gRPC address, an HTTP address, or both")
        self.handle = handle
        self.grpc_address = grpc_address
        self.http_address = http_address
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self.num_received = 0
        self.num_malformed = 0
        self.num_handler_errors = 0
        self._lock = threading.Lock()
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind and serve; raises OSError (RuntimeError from gRPC) when an address is taken."""
        if self.grpc_address is not None:
            self._grpc = grpc.server(futures.ThreadPoolExecutor(GRPC_WORKERS, thread_name_prefix="otlp-grpc"))
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._grpc)
            self.grpc_port = self._grpc.add_insecure_port(self.grpc_address)
            self._grpc.start()
        if self.http_address is not None:
            host, port = split_host_port(self.http_address)
            self._http = ThreadingHTTPServer((host, port), _http_handler(self))
            self._http.daemon_threads = True
            self.http_port = self._http.server_address[1]
            self._http_thread = threading.Thread(target=self._http.serve_forever, name="otlp-http", daemon=True)
            self._http_thread.start()
        log.info("OTLP receiver: gRPC %s, HTTP %s", self.grpc_port or "off", self.http_port or "off")

    def stop(self, grace_s: float = 2.0) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace_s).wait()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    # ---- shared by both transports -----------------------------------------------------------------
    def _deliver(self, request: ExportTraceServiceRequest) -> bool:
        with self._lock:
            self.num_received += 1
        try:
            self.handle(request)
            return True
        except Exception:
            with self._lock:
                self.num_handler_errors += 1
            log.exception("the OTLP trace handler failed; the exporter will retry")
            return False

    def _malformed(self, transport: str, why: str) -> None:
        with self._lock:
            self.num_malformed += 1
            n = self.num_malformed
        if worth_logging(n):
            log.warning("malformed OTLP %s export skipped (%d so far): %s", transport, n, why)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):  # noqa: N802 (the generated service's name)
        if not self.receiver._deliver(request):
            context.abort(grpc.StatusCode.INTERNAL, "the receiver could not store this export")
        return trace_service_pb2.ExportTraceServiceResponse()


def _http_handler(receiver: OTLPReceiver) -> type[BaseHTTPRequestHandler]:
    class OTLPHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != TRACES_PATH:
                return self._reply(404, f"no OTLP endpoint at {self.path}; traces go to {TRACES_PATH}")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                return self._reply(413, f"body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit")
            body = self.rfile.read(length)
            content_type = (self.headers.get("Content-Type") or PROTOBUF).split(";")[0].strip()
            try:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = _parse(body, content_type)
            except (DecodeError, json_format.ParseError, OSError, EOFError, UnicodeDecodeError) as exc:
                receiver._malformed("HTTP", repr(exc))
                return self._reply(400, f"not an OTLP ExportTraceServiceRequest ({content_type}): {exc}")
            except ValueError as exc:
                return self._reply(415, str(exc))
            if not receiver._deliver(request):
                return self._reply(500, "the receiver could not store this export")
            response = trace_service_pb2.ExportTraceServiceResponse()
            if content_type == JSON:
                self._send(200, json_format.MessageToJson(response).encode(), JSON)
            else:
                self._send(200, response.SerializeToString(), PROTOBUF)

        def _reply(self, status: int, message: str) -> None:
            self._send(status, message.encode(), "text/plain; charset=utf-8")

        def _send(self, status: int, payload: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, fmt: str, *args) -> None:
            log.debug("OTLP HTTP: " + fmt, *args)

    return OTLPHandler


def _parse(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        request.ParseFromString(body)
    elif content_type == JSON:
        json_format.Parse(body.decode(), request)
    else:
        raise ValueError(f"unsupported Content-Type {content_type!r}; send {PROTOBUF} or {JSON}")
    return request


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` (`[::1]:4318`, `:4318` = all interfaces) -> (host, port); ValueError when there is no port."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"expected HOST:PORT; got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)
