"""The recorded vLLM 0.32 run pushed through a real Collector: scrapes from an HTTP server, KV-event frames from a
ZMQ publisher, OTLP bodies POSTed, plus the agent steps the SDK would have stored. Used by the collector tests
and, as a store built from a real vLLM, by the analytics, alert and dashboard tests."""

from __future__ import annotations

import itertools
from contextlib import ExitStack, contextmanager

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.capture import span_bounds, store_agent_steps
from collectors.collector import Collector, CollectorOptions
from kvobs.semconv.attributes import SERVICE_INSTANCE_ID
from tests.collectors.recorded import agent_steps, kv_messages, otlp_bodies, scrapes
from tests.collectors.replay import metrics_server, publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for


def record_agent_steps(store) -> None:
    """What the agent SDK (StoreStepRecorder) would have written for the recorded workload: its steps, and each
    session's row with `ended_at` (the end of its last step: the workload ended each session there)."""
    store_agent_steps(store, agent_steps())


LATER_FROM = 0.25  # a fleet's later replicas start a quarter of the way into the recording


@contextmanager
def collect_recorded(
    store, replicas: tuple[str, ...] = ("vllm-cpu",), *, write_process: bool = False, hash_key_file: str | None = None
):
    """Run the collector over every recorded scrape, KV-event frame and OTLP body; yield the stopped collector.

    Several `replicas` make a fleet behind one collector: each has its own /metrics and KV-event stream; the first
    plays the whole recording, each later one what was recorded from `LATER_FROM` of its length on (a replica started
    later, whose /metrics answers 503 once its scrapes run out: it went down); the OTLP bodies are dealt out among
    them in turn, each tagged with its replica's `service.instance.id`, as `OTEL_RESOURCE_ATTRIBUTES` would, a later
    replica's only from when its stream is up (before, the first replica's: a replica serves no request before it
    runs). Every row keeps its recorded time: each scrape is stamped with the time it was recorded at, as the KV
    events and spans carry theirs."""
    record_agent_steps(store)
    messages, scraped = kv_messages(), scrapes()
    start = scraped[0][0] + LATER_FROM * (scraped[-1][0] - scraped[0][0])
    later = ([m for m in messages if m.recv_ts >= start], [s for s in scraped if s[0] >= start])
    plays = [(messages, scraped)] + [later] * (len(replicas) - 1)
    ports = [free_port() for _ in replicas]
    with ExitStack() as stack:
        urls = [stack.enter_context(metrics_server([body for _, body in scraped])) for _, scraped in plays]
        options = CollectorOptions(
            vllm_urls=[f"{name}={url}" for name, url in zip(replicas, urls)],
            kv_events=[f"{name}=tcp://127.0.0.1:{port}" for name, port in zip(replicas, ports)],
            kv_events_bind=True,
            otlp_http="127.0.0.1:0",
            interval_s=3600,
            write_process=write_process,
            hash_key_file=hash_key_file,
        )
        collector = Collector(options, store=store)
        collector.scraper.clock = recorded_clock([[ts for ts, _ in scraped] for _, scraped in plays])
        collector.start()
        try:
            for port, (messages, _) in zip(ports, plays):  # vLLM connected to us when recorded
                pub = stack.enter_context(publisher(f"tcp://127.0.0.1:{port}", bind=False))
                wait_subscribed(pub)
                for message in messages:
                    pub.send_multipart(message.frames)
            otlp = f"http://127.0.0.1:{collector.receiver.http_port}/v1/traces"
            live_from = [messages[0].recv_ts for messages, _ in plays]  # a replica serves once its stream is up
            for i, body in enumerate(otlp_bodies()):
                if len(replicas) > 1:
                    turn = i % len(replicas)
                    body = _exported_by(body, replicas[turn if _started(body) >= live_from[turn] else 0])
                assert httpx.post(otlp, content=body, headers={"Content-Type": "application/x-protobuf"}).is_success
            wait_for(lambda: collector.scraper.num_scrapes >= 1)  # the scraper thread's first round
            for _ in scrapes()[1:]:
                collector.scraper.scrape_all()
            for stream, expected in zip(collector.streams, [len(messages) for messages, _ in plays]):
                wait_for(lambda s=stream, n=expected: s.subscriber.num_batches == n)
        finally:
            collector.stop()
        yield collector


def recorded_clock(times: list[list[float]]):
    """The scraper's clock over a replay: scrapes go round the replicas in order, and the k-th scrape of a replica
    is stamped with its k-th recorded time (after its recording ran out, 2 s a round later: it is down)."""
    rounds = itertools.count()

    def clock() -> float:
        n = next(rounds)
        replica, k = n % len(times), n // len(times)
        recorded = times[replica]
        return recorded[k] if k < len(recorded) else recorded[-1] + 2.0 * (k - len(recorded) + 1)

    return clock


def _started(body: bytes) -> float:
    """When the earliest span of an OTLP body started (epoch s)."""
    return span_bounds(ExportTraceServiceRequest.FromString(body))[0]


def _exported_by(body: bytes, instance: str) -> bytes:
    """The OTLP body as exported by the replica `instance` (`service.instance.id` on each resource)."""
    export = ExportTraceServiceRequest.FromString(body)
    for resource_spans in export.resource_spans:
        resource_spans.resource.attributes.add(key=SERVICE_INSTANCE_ID).value.string_value = instance
    return export.SerializeToString()


@contextmanager
def collect_recorded_source(store, source: str, *, messages=None):
    """One source of the recorded run alone through a real collector, as a user who gave it only that flag: `kv`
    (`--kv-events`), `scrape` (`--vllm-url`), `spans` (`--otlp-http`, vLLM's request spans), or `steps` (the SDK's
    recorder alone); yield the stopped collector (None for `steps`). `messages`: for `kv`, these KV-event frames
    (a stretch of the recording) rather than all of them."""
    messages = kv_messages() if messages is None else messages
    if source == "steps":
        record_agent_steps(store)
        yield None
        return
    port = free_port()
    with ExitStack() as stack:
        options = {"interval_s": 3600}
        if source == "kv":
            options.update(kv_events=[f"vllm-cpu=tcp://127.0.0.1:{port}"], kv_events_bind=True)
        elif source == "scrape":
            url = stack.enter_context(metrics_server([body for _, body in scrapes()]))
            options.update(vllm_urls=[f"vllm-cpu={url}"])
        elif source == "spans":
            options.update(otlp_http="127.0.0.1:0")
        else:
            raise ValueError(f"unknown source {source!r}")
        collector = Collector(CollectorOptions(**options), store=store)
        if source == "scrape":
            collector.scraper.clock = recorded_clock([[ts for ts, _ in scrapes()]])
        collector.start()
        try:
            if source == "kv":
                pub = stack.enter_context(publisher(f"tcp://127.0.0.1:{port}", bind=False))
                wait_subscribed(pub)
                for message in messages:
                    pub.send_multipart(message.frames)
                (stream,) = collector.streams
                wait_for(lambda: stream.subscriber.num_batches == len(messages))
            elif source == "scrape":
                wait_for(lambda: collector.scraper.num_scrapes >= 1)
                for _ in scrapes()[1:]:
                    collector.scraper.scrape_all()
            else:
                otlp = f"http://127.0.0.1:{collector.receiver.http_port}/v1/traces"
                for body in otlp_bodies():
                    assert httpx.post(otlp, content=body, headers={"Content-Type": "application/x-protobuf"}).is_success
        finally:
            collector.stop()
        yield collector
