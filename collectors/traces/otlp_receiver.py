"""An OTLP trace receiver: the TraceService over gRPC and over HTTP/protobuf (JSON accepted too).

    receiver = OTLPReceiver(handle, grpc_address="0.0.0.0:4317", http_address="0.0.0.0:4318")
    receiver.start()                 # handle(ExportTraceServiceRequest) runs for every export, on a server thread
    receiver.grpc_port, receiver.http_port
    receiver.stop()

A body that is not an export request gets HTTP 400 (gRPC INVALID_ARGUMENT), is counted in `num_malformed`,
and the receiver keeps serving. A body over `MAX_BODY_BYTES`, before or after gzip, gets 413 (decompressed in
a stream that stops at the limit); a body that does not arrive within `READ_TIMEOUT_S` gets 408. The handler
returns how many spans it refused (answered as OTLP partial success) or raises `Busy` when it cannot accept the
export now (its store queue is full): HTTP 429 with `Retry-After`, gRPC RESOURCE_EXHAUSTED with `RetryInfo`, the
OTLP backpressure every exporter honours by retrying later, so nothing is acknowledged that was not accepted.
A handler that raises anything else answers 500 (gRPC INTERNAL), counted in `num_handler_errors`; the exporter
retries, as OTLP prescribes.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import duration_pb2, json_format
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvobs.addresses import split_host_port
from kvobs.logs import worth_logging

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 64 * 1024 * 1024  # on the wire and after decompression
READ_TIMEOUT_S = 30.0  # a client that stops sending its body holds no thread longer than this
GRPC_WORKERS = 4
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

Handler = Callable[[ExportTraceServiceRequest], "int | None"]  # -> spans refused (partial success), None = 0


class Busy(Exception):
    """Raised by a handler that cannot accept an export now; the exporter is told to retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class _TooLarge(Exception):
    pass


class OTLPReceiver:
    """Receive OTLP trace exports on gRPC and/or HTTP.

    Args:
        handle: called with every well-formed export request.
        grpc_address: `host:port` for the gRPC TraceService (port 0 picks one; None: off).
        http_address: `host:port` for `POST /v1/traces` (port 0 picks one; None: off).
    """

    def __init__(
        self,
        handle: Handler,
        *,
        grpc_address: str | None = "127.0.0.1:4317",
        http_address: str | None = "127.0.0.1:4318",
    ) -> None:
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
        self.num_busy = 0  # exports answered 429 / RESOURCE_EXHAUSTED (not acknowledged; the exporter retries)
        self.num_spans_refused = 0  # spans the handler refused inside accepted exports (partial success)
        self._lock = threading.Lock()
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind and serve; raises OSError (RuntimeError from gRPC) when an address is taken."""
        if self.grpc_address is not None:
            self._grpc = grpc.server(
                futures.ThreadPoolExecutor(GRPC_WORKERS, thread_name_prefix="otlp-grpc"), handlers=[_grpc_handler(self)]
            )
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
    def _deliver(self, request: ExportTraceServiceRequest) -> trace_service_pb2.ExportTraceServiceResponse | None:
        """The response to acknowledge `request` with; None when the handler failed (answer 500). Busy propagates."""
        with self._lock:
            self.num_received += 1
        try:
            refused = self.handle(request) or 0
        except Busy:
            with self._lock:
                self.num_busy += 1
                n = self.num_busy
            if worth_logging(n):
                log.warning("OTLP export refused for now, the store queue is full (%d so far); the exporter retries", n)
            raise
        except Exception:
            with self._lock:
                self.num_handler_errors += 1
            log.exception("the OTLP trace handler failed; the exporter will retry")
            return None
        response = trace_service_pb2.ExportTraceServiceResponse()
        if refused:
            with self._lock:
                self.num_spans_refused += refused
            response.partial_success.rejected_spans = refused
            response.partial_success.error_message = f"{refused} spans with attributes of the wrong type were dropped"
        return response

    def _malformed(self, transport: str, why: str) -> None:
        with self._lock:
            self.num_malformed += 1
            n = self.num_malformed
        if worth_logging(n):
            log.warning("malformed OTLP %s export skipped (%d so far): %s", transport, n, why)


def _grpc_handler(receiver: OTLPReceiver) -> grpc.GenericRpcHandler:
    """Export takes raw bytes, so a body that is not an export request is INVALID_ARGUMENT and counted (a generated
    servicer's own deserializer would answer INTERNAL before any code of ours ran)."""

    def export(body: bytes, context: grpc.ServicerContext) -> bytes:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            receiver._malformed("gRPC", repr(exc))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not an OTLP ExportTraceServiceRequest: {exc}")
        try:
            response = receiver._deliver(request)
        except Busy as busy:
            context.set_trailing_metadata([("grpc-status-details-bin", _retry_status(busy).SerializeToString())])
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(busy))
        if response is None:  # (abort raises)
            context.abort(grpc.StatusCode.INTERNAL, "the receiver could not store this export")
            return b""
        return response.SerializeToString()

    method = grpc.unary_unary_rpc_method_handler(export)
    return grpc.method_handlers_generic_handler(EXPORT_METHOD.split("/")[1], {EXPORT_METHOD.split("/")[2]: method})


def _retry_status(busy: Busy) -> status_pb2.Status:
    """google.rpc.Status with RetryInfo: how an OTLP/gRPC exporter learns the delay before its retry."""
    info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=busy.retry_after_s))
    detail = AnyProto()
    detail.Pack(info)
    return status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=str(busy), details=[detail])


def _http_handler(receiver: OTLPReceiver) -> type[BaseHTTPRequestHandler]:
    class OTLPHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = READ_TIMEOUT_S  # the socket's: a stalled body (or an idle keep-alive) frees its thread

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != TRACES_PATH:
                return self._reply(404, f"no OTLP endpoint at {self.path}; traces go to {TRACES_PATH}")
            length = self.headers.get("Content-Length")
            if length is None or not length.strip().isdigit():
                self.close_connection = True
                return self._reply(411 if length is None else 400, f"send a Content-Length (got {length!r})")
            if int(length) > MAX_BODY_BYTES:
                self.close_connection = True
                return self._reply(413, f"body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit")
            try:
                body = self.rfile.read(int(length))
            except TimeoutError:
                self.close_connection = True
                return self._reply(408, f"the body did not arrive within {READ_TIMEOUT_S:.0f} s")
            if len(body) < int(length):
                self.close_connection = True
                return self._reply(400, f"the body ended after {len(body)} of {length} bytes")
            content_type = (self.headers.get("Content-Type") or PROTOBUF).split(";")[0].strip()
            try:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gunzip(body, MAX_BODY_BYTES)
                request = _parse(body, content_type)
            except _TooLarge as exc:
                receiver._malformed("HTTP", str(exc))
                return self._reply(413, str(exc))
            except (DecodeError, json_format.ParseError, zlib.error, UnicodeDecodeError) as exc:
                receiver._malformed("HTTP", repr(exc))
                return self._reply(400, f"not an OTLP ExportTraceServiceRequest ({content_type}): {exc}")
            except ValueError as exc:
                return self._reply(415, str(exc))
            try:
                response = receiver._deliver(request)
            except Busy as busy:
                return self._send(
                    429, str(busy).encode(), "text/plain; charset=utf-8", {"Retry-After": str(busy.retry_after_s)}
                )
            if response is None:
                return self._reply(500, "the receiver could not store this export")
            if content_type == JSON:
                self._send(200, json_format.MessageToJson(response).encode(), JSON)
            else:
                self._send(200, response.SerializeToString(), PROTOBUF)

        def _reply(self, status: int, message: str) -> None:
            self._send(status, message.encode(), "text/plain; charset=utf-8")

        def _send(self, status: int, payload: bytes, content_type: str, headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, fmt: str, *args) -> None:
            log.debug("OTLP HTTP: " + fmt, *args)

    return OTLPHandler


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body, refusing (`_TooLarge`) once it grows past `limit`: a small bomb never expands."""
    stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = stream.decompress(body, limit + 1)
    if len(out) > limit:
        raise _TooLarge(f"the body decompresses to more than the {limit}-byte limit")
    if not stream.eof:
        raise zlib.error("the gzip stream is cut off")
    return out


def _parse(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        request.ParseFromString(body)
    elif content_type == JSON:
        json_format.Parse(body.decode(), request)
    else:
        raise ValueError(f"unsupported Content-Type {content_type!r}; send {PROTOBUF} or {JSON}")
    return request
