"""Real sockets that play the recorded vLLM back: an HTTP server for the scrapes, a ZMQ publisher for the KV
events, a ROUTER answering replay requests in either of vLLM's reply forms."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import zmq

from kvobs.vllm import kv_events as wire


@contextmanager
def metrics_server(responses: Sequence[str | tuple[int, str, str]]) -> Iterator[str]:
    """Serve `responses` in order, one per GET (a body, or (status, body, content type)); 503 once they run out.

    Yields the base URL."""
    lock = threading.Lock()
    pending = list(responses)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            with lock:
                item = pending.pop(0) if pending else (503, "no more recorded scrapes", "text/plain")
            status, body, ctype = (200, item, "text/plain; version=0.0.4") if isinstance(item, str) else item
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def publisher(endpoint: str, *, bind: bool, hwm: int = 1000) -> Iterator[zmq.Socket]:
    """An XPUB socket (a PUB that also reports subscriptions); `wait_subscribed` before sending. `hwm`: messages it
    queues per subscriber before dropping (ZMQ's default 1,000; vLLM's publisher sets 100,000)."""
    sock = zmq.Context.instance().socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.bind(endpoint) if bind else sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close()


def wait_subscribed(sock: zmq.Socket, timeout_ms: int = 5000) -> None:
    if not sock.poll(timeout_ms):
        raise TimeoutError("no subscriber joined")
    sock.recv()  # the subscription message


@contextmanager
def replay_router(endpoint: str, messages: Sequence[tuple[bytes, ...]], *, form: str) -> Iterator[list[int]]:
    """Answer replay requests from `messages` (topic, seq, payload; a list the caller may still append to).

    `form` "0.33" sends (topic, seq, payload) per batch, "0.24" sends (seq, payload); both end with the end
    mark. Yields the start numbers asked for."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    asked: list[int] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if not router.poll(50):
                continue
            identity, _, start = router.recv_multipart()
            first = int.from_bytes(start, "big")
            asked.append(first)
            for topic, seq, payload in list(messages):
                if int.from_bytes(seq, "big") >= first:
                    body = (topic, seq, payload) if form == "0.33" else (seq, payload)
                    router.send_multipart((identity, b"", *body))
            end = (b"", wire.REPLAY_END, b"") if form == "0.33" else (wire.REPLAY_END, b"")
            router.send_multipart((identity, b"", *end))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield asked
    finally:
        stop.set()
        thread.join(2)
        router.close()
