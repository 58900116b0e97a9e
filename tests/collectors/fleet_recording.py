"""The recorded two-replica run (tests/fixtures/fleet-kvobs-serve: two `kvobs serve` replicas under `kvobs agents
--routing round_robin`) pushed through one real Collector: each replica's scrapes from an HTTP server and KV-event
frames from a ZMQ publisher, every OTLP body POSTed as exported (the engines' spans name their replica in
`service.instance.id`; the agents' spans make the steps). `truth()`: each request's hit and routing loss, read from
the two block managers at its lookup when it was recorded."""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from functools import cache
from pathlib import Path

import httpx

from collectors.capture import KV_EVENTS, METRICS, OTLP, read_export_bodies, read_kv_messages, read_scrapes
from collectors.collector import Collector, CollectorOptions
from tests.collectors.recorded_run import recorded_clock
from tests.collectors.replay import metrics_server, publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-kvobs-serve"
VLLM_FLEET = ROOT.parent / "fleet-vllm-cpu"  # two real vLLM servers (CPU build), recorded the same way
REPLICAS = ("replica-a", "replica-b")


def cached_said(store) -> dict[str, int]:
    """request id -> the cached prompt tokens the engine's response said (its agent step's usage): vLLM's own truth
    on the vLLM fleet, which no KV event or analysis of ours produced."""
    from kvobs.analytics.steps.attribution import step_requests

    steps, reqs = store.reads.steps(), store.reads.requests()
    out = {}
    for step, sent in zip(steps.itertuples(index=False), step_requests(reqs, steps)):
        for request_id in sent["request_id"]:
            out[request_id] = int(step.cached_tokens)
    return out


@cache
def truth() -> dict:
    return json.loads((ROOT / "truth.json").read_text())


def replica_frames(name: str, root: Path = ROOT) -> list[list[bytes]]:
    return [frames for _, frames in read_kv_messages(root / name / KV_EVENTS)]


def replica_scrapes(name: str, root: Path = ROOT) -> list[str]:
    return [body for _, body in replica_timed_scrapes(name, root)]


def replica_timed_scrapes(name: str, root: Path = ROOT) -> list[tuple[float, str]]:
    """Each recorded `GET /metrics` of the replica: (when it was recorded, the body)."""
    return read_scrapes(root / name / METRICS)


def fleet_bodies(root: Path = ROOT) -> list[bytes]:
    return read_export_bodies(root / OTLP)


@contextmanager
def collect_fleet_recording(store, root: Path = ROOT, workers: int | None = None, spool_dir: Path | None = None):
    """Run one collector over both replicas' recorded scrapes and frames and every OTLP body (of the recording in
    `root`); yield it stopped. Every recorded scrape is read, stamped with the time it was recorded at, so the
    scraped counters cover the run as they did when it was recorded. `workers`: `--workers` (None: its default);
    `spool_dir`: `--spool-dir`."""
    ports = {name: free_port() for name in REPLICAS}
    scraped = {name: replica_timed_scrapes(name, root) for name in REPLICAS}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(metrics_server([body for _, body in scraped[name]])) for name in REPLICAS}
        options = CollectorOptions(
            vllm_urls=[f"{name}={urls[name]}" for name in REPLICAS],
            kv_events=[f"{name}=tcp://127.0.0.1:{ports[name]}" for name in REPLICAS],
            kv_events_bind=True,
            otlp_http="127.0.0.1:0",
            interval_s=3600,
            settle_s=0.0,
            workers=workers,
            spool_dir=None if spool_dir is None else str(spool_dir),
        )
        collector = Collector(options, store=store)
        collector.scraper.clock = recorded_clock([[ts for ts, _ in scraped[name]] for name in REPLICAS])
        collector.start()
        try:
            for name in REPLICAS:
                pub = stack.enter_context(publisher(f"tcp://127.0.0.1:{ports[name]}", bind=False))
                wait_subscribed(pub)
                for frames in replica_frames(name, root):
                    pub.send_multipart(frames)
            otlp = f"http://127.0.0.1:{collector.receiver.http_port}/v1/traces"
            for body in fleet_bodies(root):
                assert httpx.post(otlp, content=body, headers={"Content-Type": "application/x-protobuf"}).is_success
            for stream in collector.streams:
                expected = len(replica_frames(stream.spec.instance, root))
                wait_for(lambda s=stream, n=expected: s.subscriber.num_batches == n)
            wait_for(lambda: collector.scraper.num_scrapes >= 1)  # the scraper thread's first round
            for _ in range(max(map(len, scraped.values())) - 1):
                collector.scraper.scrape_all()
        finally:
            collector.stop()
        yield collector
