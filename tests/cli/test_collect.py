"""`kvobs collect` as a user runs it: a subprocess scraping a recorded vLLM, receiving OTLP, serving its own
/metrics; SIGTERM flushes the store. Bad flags and stores fail at start with one line."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvobs.store.rows import RequestRecord
from kvobs.store.spool import Spool
from tests.collectors.recorded import otlp_bodies, scrapes
from tests.collectors.replay import metrics_server
from tests.server.conftest import free_port


def wait_http(url: str, timeout_s: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def export_agent_steps(endpoint: str, outcomes: list[str]) -> None:
    """An agent session through the SDK, its spans sent by the real OTLP/HTTP exporter."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from kvobs.agent import AgentSession

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    with AgentSession("ops", tracer_provider=provider) as session:
        for outcome in outcomes:
            with session.step() as step:
                if outcome != "ok":
                    step.fail(outcome)
    provider.shutdown()


def test_collect_runs_until_sigterm_and_flushes(tmp_path):
    db = tmp_path / "kvobs.db"
    otlp, metrics = free_port(), free_port()
    bodies = [body for _, body in scrapes()][:30]
    with metrics_server(bodies + ["<html>down for maintenance</html>\n"] * 100) as url:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvobs.cli",
                "collect",
                "--vllm-url",
                f"vllm={url}",
                "--otlp-http",
                f"127.0.0.1:{otlp}",
                "--store",
                f"sqlite:///{db}",
                "--interval",
                "0.1",
                "--metrics-address",
                f"127.0.0.1:{metrics}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_http(f"http://127.0.0.1:{metrics}/metrics")
            for body in otlp_bodies():
                r = httpx.post(
                    f"http://127.0.0.1:{otlp}/v1/traces",
                    content=body,
                    headers={"Content-Type": "application/x-protobuf"},
                )
                assert r.status_code == 200
            export_agent_steps(f"http://127.0.0.1:{otlp}/v1/traces", ["ok", "ok", "timeout"])
            assert (
                httpx.post(
                    f"http://127.0.0.1:{otlp}/v1/traces",
                    content=b"not protobuf",
                    headers={"Content-Type": "application/x-protobuf"},
                ).status_code
                == 400
            )
            time.sleep(5)  # the recorded scrapes run out; the HTML pages mark vLLM down
            own = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{metrics}/metrics").text)
                for s in f.samples
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    assert own[("kvobs_collector_target_up", (("instance", "vllm"),))] == 0.0
    assert own[("kvobs_agent_steps_total", (("status", "ok"),))] == 2.0  # what the step-failure alert reads
    assert own[("kvobs_agent_steps_total", (("status", "error"),))] == 1.0
    assert own[("kvobs_agent_step_failures_total", (("error_type", "timeout"),))] == 1.0
    assert own[("kvobs_telemetry_dropped_total", (("component", "scrape"),))] > 0
    assert own[("kvobs_telemetry_dropped_total", (("component", "otlp"),))] == 1
    assert own[("kvobs_collector_llm_requests_total", ())] == 57  # the fixture README
    assert own[("kvobs_collector_otlp_exports_busy_total", ())] == own[("kvobs_collector_ids_cut_total", ())] == 0
    assert "vllm is down" in output
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 57
        assert conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == len(bodies)
        ups = [v for (v,) in conn.execute("SELECT value FROM metric_samples WHERE name = 'up' ORDER BY id")]
    assert ups[: len(bodies)] == [1.0] * len(bodies) and set(ups[len(bodies) :]) == {0.0}


def test_a_sigterm_as_soon_as_the_receiver_listens_stops_gracefully_and_writes_the_spool(tmp_path):
    """The receiver acknowledges exports from the moment it listens: a SIGTERM from then on must flush, not kill.
    Here it lands at the first accepted connection, while the collector is still starting (before this was fixed it
    died of the signal every time, the spool's backlog left unwritten: stop 42's CI failure in bench/durability)."""
    db, spool_dir, port = tmp_path / "kvobs.db", tmp_path / "spool", free_port()
    spool = Spool(spool_dir)
    for i in range(50):  # what an earlier, killed collector had acknowledged
        spool.append(
            "insert", [RequestRecord(request_id=f"r{i}", instance="vllm", arrival_ts=1000.0 + i, span_id=f"{i:016x}")]
        )
    spool.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvobs.cli", "collect", "--otlp-http", f"127.0.0.1:{port}"]
        + ["--store", f"sqlite:///{db}", "--interval", "3600", "--spool-dir", str(spool_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # no sleep: the signal must land in the first moments of listening
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            pass
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 50


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "nothing to collect"),
        (["--vllm-url", "vllm:8000"], "not an http"),
        (["--otlp-http", "127.0.0.1:0", "--store", "mysql://x/y"], "unsupported store"),
        (["--otlp-http", "127.0.0.1:0", "--forward-otlp", "jaeger:4317"], "--forward-otlp needs"),
    ],
)
def test_bad_flags_fail_at_start_with_one_line(tmp_path, args, message):
    out = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "collect", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []  # refused before any store file was created
