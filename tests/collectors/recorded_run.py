"""The recorded vLLM 0.32 run pushed through a real Collector: scrapes from an HTTP server, KV-event frames from a
ZMQ publisher, OTLP bodies POSTed, plus the agent steps the SDK would have stored. Used by the collector tests
and, as a store built from a real vLLM, by the analytics, alert and dashboard tests."""

from __future__ import annotations

from contextlib import contextmanager

import httpx

from collectors.collector import Collector, CollectorOptions
from kvobs.semconv.spans import SessionSource
from kvobs.store import StoreWriter
from kvobs.store.rows import SessionRecord, StepRecord
from tests.collectors.recorded import agent_steps, kv_messages, otlp_bodies, scrapes
from tests.collectors.replay import metrics_server, publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for


def record_agent_steps(store) -> None:
    """What the agent SDK (StoreStepRecorder) would have written for the recorded workload: its steps, and each
    session's row with `ended_at` (the end of its last step: the workload ended each session there)."""
    writer = StoreWriter(store)
    ended: dict[str, float] = {}
    for step in agent_steps():
        writer.add(StepRecord(session_id=step["session"], step_index=step["step"], trace_id=step["trace_id"],
                              span_id=step["span_id"], started_at=step["start"], ended_at=step["end"],
                              status="ok" if step["ok"] else "error"))  # fmt: skip
        ended[step["session"]] = max(ended.get(step["session"], 0.0), step["end"])
    for session, end in ended.items():
        writer.upsert(SessionRecord(session, source=SessionSource.SDK.value, ended_at=end))
    writer.close()


@contextmanager
def collect_recorded(store):
    """Run the collector over every recorded scrape, KV-event frame and OTLP body; yield the stopped collector."""
    record_agent_steps(store)
    port = free_port()
    with metrics_server([body for _, body in scrapes()]) as url:
        options = CollectorOptions(vllm_urls=[f"vllm-cpu={url}"], kv_events=[f"tcp://127.0.0.1:{port}"],
                                   kv_events_bind=True, otlp_http="127.0.0.1:0", interval_s=3600)  # fmt: skip
        collector = Collector(options, store=store)
        collector.start()
        try:
            with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub:  # vLLM connected to us when recorded
                wait_subscribed(pub)
                for message in kv_messages():
                    pub.send_multipart(message.frames)
                otlp = f"http://127.0.0.1:{collector.receiver.http_port}/v1/traces"
                for body in otlp_bodies():
                    assert httpx.post(otlp, content=body, headers={"Content-Type": "application/x-protobuf"}).is_success
                wait_for(lambda: collector.scraper.num_scrapes >= 1)  # the scraper thread's first round
                for _ in scrapes()[1:]:
                    collector.scraper.scrape_all()
                wait_for(lambda: collector.streams[0].subscriber.num_batches == len(kv_messages()))
        finally:
            collector.stop()
        yield collector
