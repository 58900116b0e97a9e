"""Every observer tells the same losses: one real engine run (capacity evictions while sessions are idle, one of
which comes back (a tool pause) and one of which is released (after its end), an invalidation, a prefix-cache
reset) fed to the Prometheus metrics, the spans, the store recorder, the vLLM-format publisher and the loss tally.
Each counts the same blocks under the same reasons, and the same idle losses as pause, after-end or pending."""

from __future__ import annotations

from collections import Counter

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import select

from instrumented_engine.engine.stats import StepResult
from instrumented_engine.observers.kv_publisher import to_wire_events
from instrumented_engine.observers.losses import LossTally
from instrumented_engine.observers.metrics import EngineMetrics
from instrumented_engine.observers.spans import EngineTracer
from instrumented_engine.observers.store import StoreRecorder
from instrumented_engine.sampling_params import SamplingParams
from kvobs.semconv import attributes as a
from kvobs.semconv.reasons import EvictionReason, InvalidationReason
from kvobs.semconv.spans import BLOCK_LOSS_KINDS
from kvobs.store import StoreWriter
from kvobs.store.schema import KVEventRow
from kvobs.vllm import kv_events as wire

BLOCK_SIZE = 16
PARAMS = SamplingParams(temperature=0, max_tokens=4)


def _run(engine, prompts: dict[str, list[int]]) -> list[StepResult]:
    """One request per session, in turn: each session is in a tool pause once its request finished."""
    results = []
    for session, tokens in prompts.items():
        engine.add_request(tokens, PARAMS, request_id=f"{session}-r", session_id=session)
        while engine.has_unfinished_requests():
            results.append(engine.step())
    return results


def _between_steps(engine, action) -> StepResult:
    """An admin action between steps (invalidate, release, reset), delivered as observers see it: a step result."""
    action(engine)
    return StepResult([], engine.current_stats(), engine.take_events())


@pytest.fixture(scope="module")
def step_results(make_llm):
    llm = make_llm(num_blocks=14, block_size=BLOCK_SIZE, max_model_len=128)
    engine = llm.engine
    prompts = {f"s{i}": [100 + 50 * i + t for t in range(70)] for i in range(4)}  # 5 blocks each, no shared prefix
    results = _run(engine, prompts)  # s2 and s3 evict the idle s0's and s1's blocks: pending
    results += _run(engine, {"s0": prompts["s0"] + [7, 8, 9]})  # s0 comes back: its losses were in a tool pause
    results.append(_between_steps(engine, lambda e: e.release_session("s1")))  # s1 is done: lost after its end
    results.append(_between_steps(engine, lambda e: e.invalidate("session_forget", session_id="s3")))
    results += _run(engine, {"s4": [900 + t for t in range(40)]})
    results.append(_between_steps(engine, lambda e: e.release_session("s4")))
    results.append(_between_steps(engine, lambda e: e.reset_prefix_cache()))
    return results


def _observe(step_results, store):
    metrics = EngineMetrics("smollm2", cache_config={}, max_model_len=128)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = EngineTracer(provider, model_name="smollm2", block_size=BLOCK_SIZE, medium="CPU")
    writer = StoreWriter(store)
    recorder = StoreRecorder(writer, instance="e0", block_size=BLOCK_SIZE, medium="CPU")
    tally = LossTally()
    wire_events = []
    for result in step_results:
        for observer in (metrics, tracer, recorder, tally):
            observer.on_step(result)
        wire_events += to_wire_events(result.events)
    writer.close()
    assert tracer.num_errors == recorder.num_errors == 0
    return metrics, exporter.get_finished_spans(), tally, wire_events


def _prometheus(metrics: EngineMetrics, name: str) -> Counter[str]:
    return Counter(
        {
            s.labels["reason"]: s.value
            for f in metrics.registry.collect()
            for s in f.samples
            if s.name == name and s.value
        }
    )


def test_every_observer_counts_the_same_losses_under_the_same_reasons(step_results, store):
    metrics, spans, tally, wire_events = _observe(step_results, store)
    evicted = _prometheus(metrics, "kvobs_kv_blocks_evicted_total")
    invalidated = _prometheus(metrics, "kvobs_kv_blocks_invalidated_total")

    # The run produced each kind of loss (else the comparison below would prove little).
    assert evicted[EvictionReason.CAPACITY] > 0 and evicted[EvictionReason.INVALIDATION] > 0
    assert evicted[EvictionReason.SESSION_RELEASE] > 0 and evicted[EvictionReason.RESET] > 0
    assert tally.num_lost_in_pause > 0 and tally.num_lost_after_end > 0

    # The loss tally (what-if) and Prometheus.
    assert Counter(tally.by_reason) == evicted
    assert invalidated == {
        InvalidationReason.SESSION_FORGET: evicted[EvictionReason.INVALIDATION],
        InvalidationReason.MANUAL_RESET: evicted[EvictionReason.RESET],
    }
    samples = {s.name: s.value for f in metrics.registry.collect() for s in f.samples if "prefix_lost" in s.name}
    assert samples["kvobs_session_prefix_lost_total"] == tally.num_lost_in_pause
    assert samples["kvobs_session_prefix_lost_pending"] == tally.num_pending

    # Store rows: one row per owner of a lost block; distinct (ts, block) per reason equals the counters.
    with store.session() as s:
        rows = s.execute(
            select(KVEventRow.kind, KVEventRow.reason, KVEventRow.ts, KVEventRow.block_hash, KVEventRow.num_tokens)
        ).all()
    lost = {(kind, reason, ts, h) for kind, reason, ts, h, _ in rows if kind in ("evicted", "invalidated")}
    by_reason = Counter(reason for _, reason, _, _ in lost)
    assert by_reason == {
        EvictionReason.CAPACITY: evicted[EvictionReason.CAPACITY],
        EvictionReason.SESSION_RELEASE: evicted[EvictionReason.SESSION_RELEASE],
        InvalidationReason.SESSION_FORGET: invalidated[InvalidationReason.SESSION_FORGET],
    }
    (cleared,) = [(reason, n) for kind, reason, _, _, n in rows if kind == "cleared"]
    assert cleared == (EvictionReason.RESET, evicted[EvictionReason.RESET] * BLOCK_SIZE)
    latest = store.reads.session_footprints()  # each session's latest snapshot
    assert latest["session_evicted_idle_blocks"].sum() == tally.num_lost_in_pause
    assert latest["session_pending_idle_blocks"].sum() == tally.num_pending

    # Spans: request spans' kvcache.evict events (capacity), kvcache.evict spans (release), invalidate spans.
    span_evicted = Counter()
    for span in spans:
        if span.name == "llm_request":
            for event in span.events:
                if event.name == "kvcache.evict":
                    (reason,) = event.attributes[a.KV_EVICTION_REASONS]
                    span_evicted[reason] += event.attributes[a.KV_BLOCKS_EVICTED]
        elif span.name == "kvcache.evict":
            (reason,) = span.attributes[a.KV_EVICTION_REASONS]
            span_evicted[reason] += span.attributes[a.KV_BLOCKS_EVICTED]
    span_invalidated = Counter(
        {
            s.attributes[a.KV_INVALIDATION_REASON]: s.attributes[a.KV_BLOCKS_INVALIDATED]
            for s in spans
            if s.name == "kvcache.invalidate"
        }
    )
    assert span_evicted == {
        EvictionReason.CAPACITY: evicted[EvictionReason.CAPACITY],
        EvictionReason.SESSION_RELEASE: evicted[EvictionReason.SESSION_RELEASE],
    }
    assert span_invalidated == invalidated

    # vLLM's wire format: one BlockRemoved hash per lost block whatever the reason, and one AllBlocksCleared.
    removed = sum(len(e.block_hashes) for e in wire_events if isinstance(e, wire.BlockRemoved))
    assert removed == sum(evicted.values()) - evicted[EvictionReason.RESET]
    assert sum(isinstance(e, wire.AllBlocksCleared) for e in wire_events) == 1


def test_a_session_that_lost_blocks_in_its_pause_is_told_so_by_spans_and_store(step_results, store):
    _, spans, tally, _ = _observe(step_results, store)
    paused = {
        s
        for span in spans
        if span.name == "llm_request"
        for e in span.events
        if e.name == "kvcache.evict"
        for s in e.attributes[a.KV_SESSIONS_PAUSED]
    }
    assert paused and paused <= {"s0", "s1", "s2"}  # only sessions that had finished a request were idle
    with store.session() as s:
        owners = set(
            s.scalars(
                select(KVEventRow.session_id).where(KVEventRow.kind == "evicted", KVEventRow.reason == "capacity")
            )
        )
    assert paused <= owners


def test_a_block_two_sessions_share_is_one_block_lost_however_many_rows_record_it(make_llm, store):
    """The store records a lost block once per owning session (each session's footprint needs its row); "blocks
    lost" (`reads.block_losses`) counts it once."""
    engine = make_llm(num_blocks=11, block_size=BLOCK_SIZE, max_model_len=160).engine  # block 0 is reserved
    shared = [500 + t for t in range(3 * BLOCK_SIZE)]  # three full blocks both sessions hold
    results = _run(engine, {"a": shared + [1, 2, 3, 4] * 4, "b": shared + [5, 6, 7, 8] * 4})
    results += _run(engine, {"c": [900 + t for t in range(150)]})  # needs all ten blocks: evicts every cached one
    writer = StoreWriter(store)
    recorder = StoreRecorder(writer, instance="e0", block_size=BLOCK_SIZE, medium="CPU")
    for result in results:
        recorder.on_step(result)
    writer.close()
    rows = store.reads.kv_events(kinds=BLOCK_LOSS_KINDS)
    distinct = rows.drop_duplicates(["instance", "ts", "block_hash", "kind", "reason"])
    shared_rows = rows[rows.duplicated(["instance", "ts", "block_hash"], keep=False)]
    assert set(shared_rows["session_id"]) == {"a", "b"} and len(shared_rows) == 2 * 3
    assert len(rows) == len(distinct) + 3
    assert store.reads.block_losses(bucket_s=1e12)["blocks"].sum() == len(distinct)
