"""Many collectors, one store: two `kvobs collect` processes, each for one replica of the recorded two-replica
fleet (tests/fixtures/fleet-kvobs-serve), write into one PostgreSQL store at once; a third naming a replica the
first holds is refused at start. The store they fill answers as the store one collector fills from the same
recording (`served_fleet`): the same KV events, requests, steps, sessions and rollups, the same routing loss (the
recorded truth, request for request), and every dashboard page shows both replicas."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import ExitStack

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.views import PAGES
from kvobs.analytics.cache.routing import fleet_losses
from kvobs.store import open_store
from tests.cli.test_collect import wait_http
from tests.collectors.fleet_recording import REPLICAS, fleet_bodies, replica_frames, replica_scrapes, truth
from tests.collectors.replay import metrics_server, publisher, wait_subscribed
from tests.dashboard.test_app import assert_clean, open_page
from tests.server.conftest import free_port
from tests.store.test_contract import _values
from tests.stores import postgres_schema, postgres_url


def _collect(
    store_url: str,
    name: str,
    kv_port: int,
    *,
    scrape_url: str | None = None,
    otlp: int | None = None,
    metrics: int | None = None,
) -> list[str]:
    command = [sys.executable, "-m", "kvobs.cli", "collect", "--store", store_url, "--settle", "0", "--interval", "1"]
    command += ["--kv-events", f"{name}=tcp://127.0.0.1:{kv_port}", "--kv-events-bind"]
    command += ["--vllm-url", f"{name}={scrape_url}"] if scrape_url else []
    command += ["--otlp-http", f"127.0.0.1:{otlp}"] if otlp else []
    command += ["--metrics-address", f"127.0.0.1:{metrics}"] if metrics else []
    return command


def _replica_of(body: bytes) -> str | None:
    """The replica whose engine exported this body (`service.instance.id`), None for the agents' own spans."""
    for spans in ExportTraceServiceRequest.FromString(body).resource_spans:
        for attribute in spans.resource.attributes:
            if attribute.key == "service.instance.id" and attribute.value.string_value in REPLICAS:
                return attribute.value.string_value
    return None


def _batches(metrics_port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "kvobs_collector_kv_wire_batches_total" and s.labels.get("instance") == name
    )


@pytest.fixture(scope="module")
def two_collectors():
    """The recording through two collector processes into a fresh PostgreSQL schema: (store, third, held, url,
    doctor): the third collector's result, the leases seen while both ran, and `kvobs doctor`'s meanwhile."""
    with postgres_schema() as schema, ExitStack() as stack:
        url = postgres_url(schema)
        ports = {name: (free_port(), free_port(), free_port()) for name in REPLICAS}  # KV events, OTLP, own metrics
        procs = {}
        for name, (kv, otlp, metrics) in ports.items():
            scrape_url = stack.enter_context(metrics_server(replica_scrapes(name)))
            command = _collect(url, name, kv, scrape_url=scrape_url, otlp=otlp, metrics=metrics)
            procs[name] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for name, (kv, _, metrics) in ports.items():
                wait_http(f"http://127.0.0.1:{metrics}/metrics")
                pub = stack.enter_context(publisher(f"tcp://127.0.0.1:{kv}", bind=False))
                try:
                    wait_subscribed(pub, timeout_ms=20_000)
                except TimeoutError:  # say why: the collector's own words, if it ended
                    alive = procs[name].poll() is None
                    raise AssertionError(f"{name}'s collector never subscribed (running: {alive})") from None
                for frames in replica_frames(name):
                    pub.send_multipart(frames)
            for body in fleet_bodies():  # each engine's spans to its replica's collector, the agents' to the first
                otlp = ports[_replica_of(body) or REPLICAS[0]][1]
                response = httpx.post(
                    f"http://127.0.0.1:{otlp}/v1/traces",
                    content=body,
                    headers={"Content-Type": "application/x-protobuf"},
                )
                assert response.is_success
            deadline = time.monotonic() + 60
            for name, (_, _, metrics) in ports.items():
                while _batches(metrics, name) < len(replica_frames(name)):
                    assert time.monotonic() < deadline, f"{name}'s collector did not take every batch"
                    time.sleep(0.2)
            store = open_store(url)
            held = {lease.instance: lease.holder for lease in store.leases.current()}
            third = subprocess.run(
                [*_collect(url, REPLICAS[0], free_port()), "--kv-events", f"other=tcp://127.0.0.1:{free_port()}"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            doctor = subprocess.run(
                [sys.executable, "-m", "kvobs.cli", "doctor", "--store", url],
                capture_output=True,
                text=True,
                timeout=120,
            )
            time.sleep(2)  # a tick after the last batch: each session's footprint is written
        finally:
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
            outputs = {name: proc.communicate(timeout=60)[0] for name, proc in procs.items()}
        assert all(proc.returncode == 0 for proc in procs.values()), outputs
        yield store, third, held, url, doctor
        store.close()


def test_a_third_collector_naming_a_held_replica_is_refused_and_takes_nothing(two_collectors):
    store, third, held, _, doctor = two_collectors
    assert sorted(held) == sorted(REPLICAS) and len(set(held.values())) == 2  # one holder each, both collectors
    assert third.returncode == 2 and "Traceback" not in third.stderr, third.stderr
    assert f"{REPLICAS[0]} held by {held[REPLICAS[0]]}" in third.stderr
    assert "other" not in store.reads.instances()  # all or none: its free instance was not taken either
    assert store.leases.current() == []  # both collectors released theirs at SIGTERM
    for name in REPLICAS:  # kvobs doctor names each replica's writer
        assert f"{name} held by {held[name]}" in doctor.stdout, doctor.stdout + doctor.stderr


def test_the_store_two_collectors_filled_answers_as_one_collectors(two_collectors, served_fleet):
    store, _, _, _, _ = two_collectors
    one = served_fleet.store
    assert store.reads.instances() == one.reads.instances() == sorted(REPLICAS)
    for read in ("kv_events", "requests", "steps", "sessions", "kv_event_counts", "block_losses", "runs"):
        got, expected = getattr(store.reads, read)(), getattr(one.reads, read)()
        assert _values(got, ordered=False) == _values(expected, ordered=False), read
    first, last = store.reads.time_range()
    losses, check = fleet_losses(store, store.reads.requests(), store.reads.steps(), first, last)
    assert check.notes == []
    routed = dict(zip(losses["request_id"], losses["routed_blocks"]))
    assert routed == {rid: v["routed_blocks"] for rid, v in truth()["requests"].items()}
    assert sum(routed.values()) > 0


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_shows_both_collectors_replicas(monkeypatch, two_collectors, page):
    _, _, _, url, _ = two_collectors
    at = open_page(monkeypatch, url, page)
    assert_clean(at)
    assert at.multiselect(key="instances").options == sorted(REPLICAS)
