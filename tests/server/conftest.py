"""Real servers for the server tests: uvicorn on a free loopback port over the shared SmolLM2 weights."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import msgspec
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from instrumented_engine.config import EngineConfig
from instrumented_engine.server.launcher import EngineServer, ServerOptions
from kvobs.vllm import kv_events as wire

SERVED = "smollm2"


_EPHEMERAL = range(32768, 61000)  # Linux's default ip_local_port_range: what bind(0) and connect() hand out
_handed: set[int] = set()


def _ephemeral() -> range:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return _EPHEMERAL


def free_port() -> int:
    """A loopback port nobody listens on, from below the ephemeral range and never handed out before in this
    process: a port-0 server or an outgoing connection started between choosing it and binding it cannot take it."""
    ephemeral = _ephemeral()
    candidates = [p for p in range(10000, ephemeral.start) if p not in _handed] or list(ephemeral)
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        return port
    raise OSError("no free loopback port below the ephemeral range")


@contextmanager
def running_server(source, *, options: dict | None = None, telemetry=None, **config) -> Iterator[EngineServer]:
    config.setdefault("max_model_len", 512)
    config.setdefault("num_blocks", 96)
    opts = ServerOptions(port=0, served_model_name=SERVED, **(options or {}))
    server = EngineServer(EngineConfig(**config), opts, source=source, progress=False, telemetry=telemetry)
    server.start_in_background()
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def kv_ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture(scope="module")
def server(smollm2_source, kv_ports) -> Iterator[EngineServer]:
    """One server per test module, publishing KV events on a wildcard endpoint with replay."""
    pub, replay = kv_ports
    options = {
        "kv_events_endpoint": f"tcp://*:{pub}",
        "kv_events_replay_endpoint": f"tcp://*:{replay}",
        "kv_events_topic": "kv",
    }
    with running_server(smollm2_source, options=options) as srv:
        yield srv


@pytest.fixture
def subscriber(kv_ports) -> Iterator[zmq.Socket]:
    """A SUB socket connected to the module server's KV-event stream (vLLM bound with '*')."""
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{kv_ports[0]}")
    time.sleep(0.3)  # a PUB drops what it sends before the subscription reaches it
    yield sock
    sock.close()


STOCK_DECODER = msgspec.msgpack.Decoder(wire.KVEventBatch)  # what a stock vLLM subscriber does


def receive_events(sock: zmq.Socket, *, idle_s: float = 1.0) -> list[tuple[int, object]]:
    """Every (sequence number, event) published until the stream is quiet for `idle_s`.

    Decoded strictly, as vLLM's own subscriber does (`Decoder(type=KVEventBatch)`), not leniently.
    """
    out = []
    while sock.poll(int(idle_s * 1000)):
        _, seq, payload = sock.recv_multipart()
        batch = STOCK_DECODER.decode(payload)
        out.extend((wire.seq_from_bytes(seq), e) for e in batch.events)
    return out


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """GET /metrics parsed by prometheus_client: {(sample name, sorted labels without model/engine): value}."""
    text = httpx.get(url + "/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("model_name", "engine")))
            samples[(sample.name, labels)] = sample.value
    return samples


def ask_session(server, session: str, text: str) -> int:
    """`text` as session `session`'s chat request (two tokens back); the cached prompt tokens its reply gave."""
    body = {"model": SERVED, "max_tokens": 2, "temperature": 0, "messages": [{"role": "user", "content": text}]}
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"X-Session-ID": session}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def filler_prompt(k: int) -> str:
    """A prompt of words no other prompt shares: it takes cache room from the others."""
    return f"Filler {k}: " + " ".join(f"word{k}x{i}" for i in range(14))
