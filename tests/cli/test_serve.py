"""`kvobs serve` as a user runs it: a subprocess on the real SmolLM2, stopped with SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from sqlalchemy import text

from instrumented_engine.commands.engine_flags import parse_size
from kvobs.store import open_store
from tests.otlp import otlp_receiver
from tests.server.conftest import free_port


def serve_and_complete(port: int, *extra: str, headers: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start `kvobs serve`, wait for /health, complete one prompt, stop it with SIGTERM; returns (proc, output)."""
    cmd = [
        sys.executable,
        "-m",
        "kvobs.cli",
        "serve",
        "--port",
        str(port),
        "--num-blocks",
        "64",
        "--max-model-len",
        "512",
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "kvobs serve did not become healthy"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    return proc, out


def test_serve_starts_announces_its_url_answers_and_stops_cleanly():
    port = free_port()
    proc, out = serve_and_complete(port)
    assert proc.returncode == 0, out
    assert f"at http://127.0.0.1:{port}" in out  # the log line with the URL
    assert "loading SmolLM2" in out  # the progress bar while the weights load
    assert out.rstrip().endswith("kvobs engine stopped")  # engine loop stopped, KV events flushed


def test_sigterm_flushes_spans_and_store_rows(tmp_path):
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"
    with otlp_receiver() as (receiver, received):
        endpoint = f"http://127.0.0.1:{receiver.http_port}"
        proc, out = serve_and_complete(
            free_port(),
            "--store",
            url,
            "--otlp-endpoint",
            endpoint,
            "--otlp-protocol",
            "http/protobuf",
            "--instance",
            "cli-engine",
            headers={"traceparent": traceparent, "X-Session-ID": "cli"},
        )
        assert proc.returncode == 0, out
        (span,) = received.named("llm_request")  # exported at shutdown at the latest
    assert span.trace_id == trace_id and span.parent_span_id == "00f067aa0ba902b7" and span.service == "kvobs-engine"
    store = open_store(url)
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT instance, session_id, trace_id, completion_tokens FROM requests")).all()
        assert rows == [("cli-engine", "cli", trace_id, 4)]
        kinds = conn.execute(text("SELECT DISTINCT kind FROM kv_events")).scalars().all()
        assert sorted(kinds) == ["allocated", "hit"]  # a 6-token prompt fills no block: nothing is stored
    assert store.leases.current() == []  # its lease on `cli-engine` released at the stop
    store.close()


def test_serve_refuses_an_instance_another_writer_holds_before_loading_the_model(tmp_path):
    """Two writers of one instance would merge two caches' events into one: `kvobs serve --store` claims its instance
    as a collector claims its replicas, and a live holder's lease is refused at start, naming the holder."""
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    store = open_store(url)
    holder = f"collect@{socket.gethostname()}:{os.getpid()}/0000test"  # this test process: alive
    store.leases.claim(["engine-a"], holder, ttl_s=60.0)
    out = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "serve", "--store", url, "--instance", "engine-a", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and f"engine-a held by {holder}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "loading SmolLM2" not in out.stderr + out.stdout
    store.close()


BAD_STORES = [("mysql://db/kvobs", "unsupported store 'mysql'"), ("postgresql://x@127.0.0.1:1/x", "cannot reach")]


@pytest.mark.parametrize(("url", "message"), BAD_STORES)
def test_serve_refuses_a_bad_store_at_start(url, message):
    out = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "serve", "--num-blocks", "64", "--max-model-len", "1008", "--store", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_serve_reports_bad_configuration_without_a_traceback():
    out = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "serve", "--num-blocks", "8", "--max-model-len", "2048"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "it needs 129 blocks (block 0 is reserved)" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("text", "size"), [("1073741824", 1 << 30), ("512MiB", 512 << 20), ("2GiB", 2 << 30), ("1.5G", 3 << 29)]
)
def test_sizes_parse_in_powers_of_1024(text, size):
    assert parse_size(text) == size


def test_bad_size_is_an_argument_error():
    with pytest.raises(argparse.ArgumentTypeError, match="not a size"):
        parse_size("lots")
