"""instrumentation.py on hand-made step results: OTel metrics equal /metrics, spans never raise into the engine."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import RequestOutput, SchedulerStats, StepResult
from instrumented_engine.observers.metrics import EngineMetrics
from instrumented_engine.observers.otel_metrics import OTelMetricSink
from instrumented_engine.observers.spans import EngineTracer
from kvobs.semconv import attributes as a
from kvobs.semconv.buckets import TTFT_BUCKETS
from kvobs.semconv.metrics import kvobs_metrics
from kvobs.store import StoreWriter, open_store
from kvobs.store.retention import EXPIRED_TABLE, Retention
from kvobs.store.rows import KVEventRecord
from kvobs.store.schema import DAY_S

STATS = SchedulerStats(
    ts=10.0,
    num_running=1,
    num_waiting=2,
    num_blocks_total=63,
    num_blocks_free=40,
    num_blocks_resident=12,
    kv_cache_usage=23 / 63,
    num_scheduled_tokens=48,
    num_prefill_tokens=47,
    num_decode_tokens=1,
    num_preempted=0,
)


def output(rid: str, session: str, **changes) -> RequestOutput:
    fields = dict(
        request_id=rid,
        session_id=session,
        new_token_ids=[5],
        output_token_ids=[5],
        text="x",
        finished=True,
        finish_reason="stop",
        num_prompt_tokens=48,
        num_cached_tokens=32,
        num_preemptions=0,
        arrival_ts=9.0,
        scheduled_ts=9.25,
        first_token_ts=9.5,
        finished_ts=10.0,
        max_tokens=16,
        temperature=0.0,
        top_p=1.0,
    )
    fields.update(changes)
    return RequestOutput(**fields)


def evicted(ts: float, rid: str | None, owners: tuple[str, ...], reason="capacity", **kw) -> ev.BlockEvicted:
    return ev.BlockEvicted(
        ts,
        rid,
        "b" if rid else None,
        block_id=3,
        block_hash=2**64 - 2,
        parent_block_hash=None,
        reason=reason,
        owner_sessions=owners,
        lifetime_s=4.0,
        idle_s=1.5,
        **kw,
    )


def otel_points(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    return {
        m.name: list(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


def test_otel_metrics_mirror_the_prometheus_values():
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    metrics = EngineMetrics(
        "smollm2", cache_config={"block_size": "16"}, max_model_len=512, extra_sinks=[OTelMetricSink(meter)]
    )
    events = [
        ev.PrefixLookup(9.25, "r1", "a", query_tokens=48, hit_tokens=32, hit_blocks=2),
        evicted(9.3, "r1", ("b",)),
        evicted(9.3, "r1", ("b",)),
    ]
    metrics.on_step(StepResult([output("r1", "a")], STATS, events))
    prom = {(s.name, s.labels.get("reason")): s.value for f in metrics.registry.collect() for s in f.samples}
    points = otel_points(reader)
    assert points["vllm.kv_cache_usage_perc"][0].value == prom[("vllm:kv_cache_usage_perc", None)] == 23 / 63
    assert points["vllm.prefix_cache_hits"][0].value == prom[("vllm:prefix_cache_hits_total", None)] == 32
    by_source = {
        s.labels["source"]: s.value
        for f in metrics.registry.collect()
        for s in f.samples
        if s.name == "vllm:prompt_tokens_by_source_total"
    }
    assert by_source == {"local_compute": 16, "local_cache_hit": 32, "external_kv_transfer": 0}  # vLLM's sources
    evict = {p.attributes["reason"]: p.value for p in points["kvobs_kv_blocks_evicted"]}
    assert evict["capacity"] == prom[("kvobs_kv_blocks_evicted_total", "capacity")] == 2
    (ttft,) = points["vllm.time_to_first_token_seconds"]
    assert ttft.count == 1 and ttft.sum == prom[("vllm:time_to_first_token_seconds_sum", None)] == 1.0
    assert tuple(ttft.explicit_bounds) == TTFT_BUCKETS  # vLLM's buckets, not OTel's defaults
    assert ttft.attributes == {"model_name": "smollm2", "engine": "0"}


def make_tracer() -> tuple[EngineTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return EngineTracer(provider, model_name="smollm2", block_size=16, medium="CPU"), exporter


def test_request_span_has_vllm_latencies_kv_events_and_links_to_evicted_sessions():
    tracer, exporter = make_tracer()
    tracer.on_step(
        StepResult(
            [output("ra", "a", arrival_ts=1.0, scheduled_ts=1.1, first_token_ts=1.2, finished_ts=1.5)], STATS, []
        )
    )
    steps = [
        [
            ev.PrefixLookup(9.25, "rb", "b", query_tokens=48, hit_tokens=0, hit_blocks=0),
            evicted(9.3, "rb", ("a",), paused_sessions=("a",)),
            evicted(9.3, "rb", ("a", "c")),
            ev.BlocksAllocated(9.3, "rb", "b", block_ids=(3, 4, 5), num_free_after=40),
        ],
        [
            ev.Preempted(9.4, "rb", "b", num_blocks_freed=3, num_computed_tokens_lost=48),
            ev.Resumed(9.45, "rb", "b", hit_tokens=32, num_preemptions=1),
        ],
    ]
    for events in steps:
        tracer.on_step(StepResult([], STATS, events))
    tracer.on_step(StepResult([output("rb", "b", num_preemptions=1)], STATS, []))
    span_a, span_b = exporter.get_finished_spans()
    assert span_b.start_time == 9_000_000_000 and span_b.end_time == 10_000_000_000
    assert span_b.attributes[a.GEN_AI_LATENCY_TIME_IN_QUEUE] == 0.25 and span_b.attributes[a.KV_BLOCKS_EVICTED] == 2
    assert span_b.attributes[a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] == 0.5
    names = [e.name for e in span_b.events]
    assert names == [
        "kvcache.prefix_lookup",
        "kvcache.evict",
        "kvcache.allocate",
        "kvcache.preempt",
        "kvcache.resume",
        "kvcache.first_token",
    ]
    evict = span_b.events[1].attributes
    assert evict[a.KV_BLOCKS_EVICTED] == 2 and list(evict[a.KV_SESSIONS_AFFECTED]) == ["a", "c"]
    assert list(evict[a.KV_SESSIONS_PAUSED]) == ["a"]
    (link,) = span_b.links  # session c never had a request span: nothing to link
    assert link.context.span_id == span_a.context.span_id and link.attributes[a.KV_BLOCKS_EVICTED] == 2


def test_a_broken_step_is_counted_and_never_raised():
    tracer, exporter = make_tracer()
    tracer.on_step(StepResult([object()], STATS, []))  # not a RequestOutput
    tracer.on_step(StepResult([output("r1", "a")], STATS, []))
    assert tracer.num_errors == 1 and [s.name for s in exporter.get_finished_spans()] == ["llm_request"]


def test_release_evictions_and_resets_become_their_own_spans():
    tracer, exporter = make_tracer()
    tracer.on_step(StepResult([output("r1", "s1")], STATS, []))
    tracer.on_step(
        StepResult(
            [],
            STATS,
            [evicted(11.0, None, ("s1",), reason="session_release"), ev.CacheCleared(12.0, None, None, 5, ("s1",))],
        )
    )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    release, reset = spans["kvcache.evict"], spans["kvcache.invalidate"]
    assert release.name == "kvcache.evict" and list(release.attributes[a.KV_EVICTION_REASONS]) == ["session_release"]
    assert reset.name == "kvcache.invalidate" and reset.attributes[a.KV_INVALIDATION_REASON] == "manual_reset"
    assert [ln.attributes[a.KV_LINK_RELATION] for ln in reset.links] == [a.LINK_INVALIDATED]


def test_dropped_telemetry_is_counted_from_each_components_total():
    metrics = EngineMetrics("smollm2", cache_config={}, max_model_len=512)
    totals = {"store": 0, "otlp": 0}
    for component in totals:
        metrics.watch_dropped(component, lambda c=component: totals[c])
    totals["store"] = 7
    metrics.on_step(StepResult([], STATS, []))  # every step brings the counter up to date
    totals["store"], totals["otlp"] = 9, 2
    metrics.sync_dropped()  # as /metrics does before a scrape
    metrics.sync_dropped()  # nothing new: no double counting
    values = {
        s.labels["component"]: s.value
        for f in metrics.registry.collect()
        for s in f.samples
        if s.name == "kvobs_telemetry_dropped_total"
    }
    assert values == {"store": 9, "otlp": 2}


def test_step_spans_are_sampled_every_nth_step():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = EngineTracer(provider, model_name="smollm2", block_size=16, medium="CPU", step_sample_every=2)
    for _ in range(5):
        tracer.on_step(StepResult([], STATS, []))
    steps = exporter.get_finished_spans()
    assert [s.name for s in steps] == ["kvcache.step"] * 2
    assert steps[0].attributes[a.KV_BATCH_TOKENS] == 48 and steps[0].attributes[a.KV_BLOCKS_FREE] == 40


def test_rows_retention_dropped_are_counted_on_the_engines_metrics(tmp_path):
    """What `kvobs serve --retention-days` wires: the retention's running total as kvobs_store_rows_expired_total."""
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    writer = StoreWriter(store)
    writer.add_many([KVEventRecord(ts=1000.0 + i, instance="e", kind="stored", block_hash=i + 1) for i in range(5)])
    writer.close()
    retention = Retention(store, days=1.0, clock=lambda: 1000.0 + 2.5 + DAY_S)  # the first three are over a day old
    metrics = EngineMetrics("smollm2", cache_config={}, max_model_len=512)
    metrics.watch_total(kvobs_metrics.STORE_ROWS_EXPIRED, lambda: retention.num_expired, table=EXPIRED_TABLE)
    retention.run_once()
    metrics.sync_dropped()
    metrics.sync_dropped()  # no double counting
    values = {
        s.labels["table"]: s.value
        for f in metrics.registry.collect()
        for s in f.samples
        if s.name == "kvobs_store_rows_expired_total"
    }
    assert values == {"kv_events": 3}
    store.close()
