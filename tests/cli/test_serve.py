"""`kvobs serve` as a user runs it: a subprocess on the real SmolLM2, stopped with SIGTERM."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

import httpx
import pytest

from kvobs.commands._common import parse_size
from tests.server.conftest import free_port


def test_serve_starts_announces_its_url_answers_and_stops_cleanly():
    port = free_port()
    cmd = [sys.executable, "-m", "kvobs.cli", "serve", "--port", str(port), "--num-blocks", "64",
           "--max-model-len", "512"]  # fmt: skip
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
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert f"at http://127.0.0.1:{port}" in out  # the log line with the URL
    assert "loading SmolLM2" in out  # the progress bar while the weights load
    assert out.rstrip().endswith("kvobs engine stopped")  # engine loop stopped, KV events flushed


def test_serve_reports_bad_configuration_without_a_traceback():
    out = subprocess.run([sys.executable, "-m", "kvobs.cli", "serve", "--num-blocks", "8", "--max-model-len", "2048"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "needs 129 (block 0 is reserved)" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("text", "size"), [("1073741824", 1 << 30), ("512MiB", 512 << 20), ("2GiB", 2 << 30), ("1.5G", 3 << 29)]
)
def test_sizes_parse_in_powers_of_1024(text, size):
    assert parse_size(text) == size


def test_bad_size_is_an_argument_error():
    with pytest.raises(argparse.ArgumentTypeError, match="not a size"):
        parse_size("lots")
