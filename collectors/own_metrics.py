"""The collector's own Prometheus metrics, read from its components' running totals at scrape time.

    registry = CollectorRegistry(); registry.register(CollectorMetrics(collector))
    start_http_server(9400, registry=registry)

Counters are exposed from totals the components keep (so nothing is counted twice):
`kvobs_telemetry_dropped_total{component}` (scrape, kv_events, otlp, otlp_forward, store),
`kvobs_collector_kv_events_total{instance}`, `kvobs_collector_kv_event_batches_lost_total{instance}`,
`kvobs_collector_kv_streams_silent_total{instance}` (a stream silent while its replica served: `kv_silence`),
`kvobs_collector_kv_worker_restarts_total{instance}` and the gauge `kvobs_collector_kv_worker_up{instance}` (the
worker process reading a stream, with `--workers`),
`kvobs_collector_kv_wire_batches_total{instance,shape}` and the gauge `kvobs_collector_kv_event_lag_seconds{instance}`
(what `kvobs doctor` reads),
`kvobs_collector_llm_requests_total`, `kvobs_collector_otlp_exports_busy_total` (exports answered 429),
`kvobs_collector_ids_cut_total`, `kvobs_collector_leases_lost_total{instance}` (`leases`), the routing loss of a
fleet's requests
(`kvobs_collector_routing_loss_tokens_total{instance}` over `kvobs_collector_routing_compared_prompt_tokens_total`,
`..._compared_requests_total`, `kvobs_collector_routing_late_requests_total`, and
`kvobs_collector_routing_unmeasured_seconds_total{instance}`, what a meter restarted too late left:
`routing_meter`),
`kvobs_collector_step_verdicts_total{kind}` (steps decided once their session settled, `step_verdicts`, by what cost
each: `kvobs.analytics.steps.verdicts.cost_kind`),
`kvobs_session_prefix_lost_total` (blocks removed while their session was idle), `kvobs_agent_steps_total{status}`
and `kvobs_agent_step_failures_total{error_type}` (the SDK's agent_step spans it received and the steps it made of
agent frameworks' spans), `kvobs_collector_span_steps_total{source}` (those steps by convention),
`kvobs_collector_steps_joined_total{method,source}` (how each was joined to its server request, or why not),
`kvobs_collector_dynamo_trace_rows_total{outcome}` (Dynamo's request-trace rows, with `--dynamo-trace`) and
`kvobs_collector_dynamo_trace_joins_total{outcome}` (their requests joined with their workers' KV events), the
gauge `kvobs_collector_target_up{instance}` that alert rules watch for a vLLM that is down, and the store writer's
queue (`kvobs_store_queue_rows`, `..._peak_rows`, `..._capacity_rows`, `kvobs_store_queue_full_total`,
`kvobs_store_drain_lag_seconds`, `..._drain_lag_peak_seconds`: how a burst is absorbed).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector as PromCollector

from collectors.kv.shared_starts import STARTS
from kvobs.analytics.steps import COST_KINDS
from kvobs.semconv.metric_spec import MetricSpec
from kvobs.semconv.metrics import (
    LABEL_COMPONENT,
    LABEL_ERROR_TYPE,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_MEDIUM,
    LABEL_METHOD,
    LABEL_OUTCOME,
    LABEL_REASON,
    LABEL_SHAPE,
    LABEL_SOURCE,
    LABEL_STATUS,
    LABEL_TABLE,
    LABEL_TIE,
    LABEL_WORKER,
    kvobs_metrics,
)
from kvobs.semconv.spans import CachedFill
from kvobs.store.retention import EXPIRED_TABLE


def _counter(spec: MetricSpec, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(spec.name, spec.description, labels=list(labels))


def _by_label(spec: MetricSpec, label: str, totals: dict[str, int]) -> CounterMetricFamily:
    family = _counter(spec, (label,))
    for value, total in sorted(dict(totals).items()):
        family.add_metric([value], total)
    return family


def _up(spec: MetricSpec, states: dict[str, bool]) -> GaugeMetricFamily:
    """A gauge of 1 or 0 per instance (up or not)."""
    family = GaugeMetricFamily(spec.name, spec.description, labels=[LABEL_INSTANCE])
    for instance, is_up in sorted(states.items()):
        family.add_metric([instance], 1.0 if is_up else 0.0)
    return family


class CollectorMetrics(PromCollector):
    def __init__(self, collector) -> None:
        self.collector = collector

    def collect(self):
        c = self.collector
        yield _by_label(kvobs_metrics.TELEMETRY_DROPPED, LABEL_COMPONENT, c.dropped_totals())
        yield _up(kvobs_metrics.COLLECTOR_TARGET_UP, c.targets_up())
        expired = _counter(kvobs_metrics.STORE_ROWS_EXPIRED, (LABEL_TABLE,))
        if c.retention is not None:
            expired.add_metric([EXPIRED_TABLE], c.retention.num_expired)
        yield expired
        yield _by_label(
            kvobs_metrics.COLLECTOR_LEASES_LOST,
            LABEL_INSTANCE,
            {name: c.leases.num_lost[name] for name in c.leases.instances},
        )
        yield from _store_queue(c.writer)
        yield from _kv_streams(c)
        yield from _routing(c.routing_meter)
        yield from _spans(c)


def _store_queue(writer):
    """The store writer's queue: rows held uncommitted and the oldest's wait, now and at their peaks, and its room."""
    rows, lag_s, peak_rows, peak_lag_s = writer.depth_now()
    for spec, value in (
        (kvobs_metrics.STORE_QUEUE_ROWS, rows),
        (kvobs_metrics.STORE_QUEUE_PEAK_ROWS, peak_rows),
        (kvobs_metrics.STORE_QUEUE_CAPACITY_ROWS, writer.max_queue),
        (kvobs_metrics.STORE_DRAIN_LAG, lag_s),
        (kvobs_metrics.STORE_DRAIN_LAG_PEAK, peak_lag_s),
    ):
        yield GaugeMetricFamily(spec.name, spec.description, value=value)
    full = _counter(kvobs_metrics.STORE_QUEUE_FULL)
    full.add_metric([], writer.num_full)
    yield full


def _kv_streams(c):
    """The KV-event streams': events taken and lost, what the ingest counted, wire shapes and lag, silences."""
    events = _counter(kvobs_metrics.COLLECTOR_KV_EVENTS, (LABEL_INSTANCE,))
    lost = _counter(kvobs_metrics.COLLECTOR_KV_EVENTS_LOST, (LABEL_INSTANCE,))
    for stream in c.streams:
        events.add_metric([stream.spec.instance], stream.subscriber.num_events)
        lost.add_metric([stream.spec.instance], stream.subscriber.num_lost)
    yield events
    yield lost
    yield from _session_losses(c.streams)
    per_stream = {  # a count each stream's ingest keeps, one series per stream
        kvobs_metrics.COLLECTOR_KV_OFFLOAD_PLACEHOLDERS: lambda ingest: ingest.num_placeholders,
        kvobs_metrics.COLLECTOR_KV_REPEATED_STORES: lambda ingest: ingest.num_repeated_stores,
        kvobs_metrics.COLLECTOR_KV_UNKNOWN_REMOVALS: lambda ingest: ingest.num_unknown_removals,
    }
    starts = (
        kvobs_metrics.COLLECTOR_KV_CHAIN_STARTS,
        kvobs_metrics.COLLECTOR_KV_SHORT_SHARED_STARTS,
        kvobs_metrics.COLLECTOR_KV_SHORT_SHARED_TOKENS,
        kvobs_metrics.COLLECTOR_KV_SHORT_SHARED_STORED_TOKENS,
    )
    for spec, name in zip(starts, STARTS, strict=True):  # a stream's shared starts (`SharedStarts`)
        per_stream[spec] = lambda ingest, name=name: getattr(ingest.starts, name)
    for spec, count in per_stream.items():
        yield _by_label(spec, LABEL_INSTANCE, {s.spec.instance: count(s.ingest) for s in c.streams})
    unknown = _counter(kvobs_metrics.COLLECTOR_KV_UNKNOWN_TIER_BLOCKS, (LABEL_INSTANCE, LABEL_MEDIUM))
    for stream in c.streams:
        for medium, n in sorted(stream.ingest.unknown_tiers.items()):
            unknown.add_metric([stream.spec.instance, medium], n)
    yield unknown
    shapes = _counter(kvobs_metrics.COLLECTOR_KV_WIRE_BATCHES, (LABEL_INSTANCE, LABEL_SHAPE))
    spec = kvobs_metrics.COLLECTOR_KV_EVENT_LAG
    lag = GaugeMetricFamily(spec.name, spec.description, labels=[LABEL_INSTANCE])
    for stream in c.streams:
        for shape, n in sorted(stream.subscriber.shapes.items()):
            shapes.add_metric([stream.spec.instance, shape], n)
        if stream.subscriber.lag_s is not None:
            lag.add_metric([stream.spec.instance], stream.subscriber.lag_s)
    yield shapes
    yield lag
    yield _by_label(
        kvobs_metrics.COLLECTOR_KV_STREAMS_SILENT,
        LABEL_INSTANCE,
        {s.spec.instance: c.kv_silence.num_silent[s.spec.instance] for s in c.streams},
    )
    if c.streams:
        spec = kvobs_metrics.COLLECTOR_KV_CORE_COMPILED
        yield GaugeMetricFamily(spec.name, spec.description, value=int(c.kv_core.compiled))
    if c.pool is not None:  # (streams read in worker processes: `collectors.kv.workers`)
        yield from _worker_queues(c.pool)
        yield _by_label(kvobs_metrics.COLLECTOR_KV_WORKER_RESTARTS, LABEL_INSTANCE, c.pool.restarts())
        yield _up(kvobs_metrics.COLLECTOR_KV_WORKER_UP, c.pool.up())


def _worker_queues(pool):
    """Each stream worker's own store writer, where it writes the store itself (as `_store_queue` says the
    collector's); nothing where the workers' rows go to the collector's writer."""
    queues = {f"worker-{w.index}": w.stats.get("queue") for w in pool.workers}
    queues = {name: queue for name, queue in queues.items() if queue is not None}
    if not queues:
        return
    gauges = {  # (the keys the worker reports them by: `collectors.kv.worker._queue`)
        "rows": kvobs_metrics.WORKER_STORE_QUEUE_ROWS,
        "lag_s": kvobs_metrics.WORKER_STORE_DRAIN_LAG,
        "peak_rows": kvobs_metrics.WORKER_STORE_QUEUE_PEAK_ROWS,
        "peak_lag_s": kvobs_metrics.WORKER_STORE_DRAIN_LAG_PEAK,
        "room": kvobs_metrics.WORKER_STORE_QUEUE_CAPACITY_ROWS,
    }
    for key, spec in gauges.items():
        family = GaugeMetricFamily(spec.name, spec.description, labels=[LABEL_WORKER])
        for name, queue in queues.items():
            family.add_metric([name], queue[key])
        yield family
    full = {name: queue["full"] for name, queue in queues.items()}
    yield _by_label(kvobs_metrics.WORKER_STORE_QUEUE_FULL, LABEL_WORKER, full)


def _session_losses(streams):
    """The sessions' prefix blocks lost in tool pauses (settled, and pending their session's return), over every
    stream, and the sessions forgotten unreturned."""
    prefix_lost = _counter(kvobs_metrics.SESSION_PREFIX_LOST)
    pending = kvobs_metrics.SESSION_PREFIX_LOST_PENDING
    prefix_pending = GaugeMetricFamily(pending.name, pending.description)
    forgotten = _counter(kvobs_metrics.COLLECTOR_SESSIONS_FORGOTTEN)
    if streams:
        prefix_lost.add_metric([], sum(s.ingest.num_lost_in_pause for s in streams))
        prefix_pending.add_metric([], sum(s.ingest.num_pending_idle for s in streams))
        forgotten.add_metric([], sum(s.ingest.num_sessions_forgotten for s in streams))
    yield forgotten
    yield prefix_lost
    yield prefix_pending


def _routing(meter):
    """The routing meter's: what each replica's requests lost to routing, what was compared, what could not be."""
    instances = sorted(meter.instances) if meter is not None else []
    for spec, totals in (
        (kvobs_metrics.COLLECTOR_ROUTING_LOSS, meter.routed_tokens if meter else {}),
        (kvobs_metrics.COLLECTOR_ROUTING_COMPARED_TOKENS, meter.compared_tokens if meter else {}),
        (kvobs_metrics.COLLECTOR_ROUTING_COMPARED_REQUESTS, meter.compared_requests if meter else {}),
    ):  # every KV-event instance of the collector from the start, at 0 until measured (a rate() needs the series)
        yield _by_label(spec, LABEL_INSTANCE, {name: totals.get(name, 0) for name in instances})
    uncomparable = _counter(kvobs_metrics.COLLECTOR_ROUTING_UNCOMPARABLE, (LABEL_INSTANCE, LABEL_REASON))
    for (instance, reason), n in sorted((meter.uncomparable if meter is not None else {}).items()):
        uncomparable.add_metric([instance, reason], n)
    yield uncomparable
    yield _by_label(
        kvobs_metrics.COLLECTOR_ROUTING_UNMEASURED,
        LABEL_INSTANCE,
        {name: meter.unmeasured_s if meter else 0.0 for name in instances},
    )
    late = _counter(kvobs_metrics.COLLECTOR_ROUTING_LATE)
    late.add_metric([], meter.num_late if meter is not None else 0)
    yield late


def _spans(c):
    """The traces' side: requests and agent steps from spans, their joins, verdicts decided, ids cut, blocks tied."""
    requests = _counter(kvobs_metrics.COLLECTOR_LLM_REQUESTS)
    requests.add_metric([], c.span_ingest.num_requests)
    yield requests
    busy = _counter(kvobs_metrics.COLLECTOR_OTLP_BUSY)
    busy.add_metric([], c.receiver.num_busy if c.receiver is not None else 0)
    yield busy
    cut = _counter(kvobs_metrics.COLLECTOR_IDS_CUT)
    cut.add_metric([], c.span_ingest.num_ids_cut + sum(s.ingest.num_ids_cut for s in c.streams))
    yield cut
    decided = c.verdicts.decided_by_kind  # every kind from the start, at 0 until decided (a rate() needs it)
    yield _by_label(kvobs_metrics.COLLECTOR_STEP_VERDICTS, LABEL_KIND, {k: decided[k] for k in COST_KINDS})
    yield _by_label(kvobs_metrics.AGENT_STEPS, LABEL_STATUS, c.span_ingest.agent_steps + c.span_steps.statuses)
    yield _by_label(
        kvobs_metrics.AGENT_STEP_FAILURES,
        LABEL_ERROR_TYPE,
        c.span_ingest.agent_step_failures + c.span_steps.failures,
    )
    yield _by_label(kvobs_metrics.COLLECTOR_SPAN_STEPS, LABEL_SOURCE, c.span_steps.by_source)
    joined = _counter(kvobs_metrics.COLLECTOR_STEPS_JOINED, (LABEL_METHOD, LABEL_SOURCE))
    for (method, source), n in sorted(c.span_steps.joins.items()):
        joined.add_metric([method, source], n)
    yield joined
    filled = {o.value: c.span_steps.cached_fills[o.value] for o in CachedFill}  # each at 0 until it happens
    yield _by_label(kvobs_metrics.COLLECTOR_REQUESTS_CACHED_FILLED, LABEL_OUTCOME, filled)
    if c.block_owners is not None:
        yield _by_label(kvobs_metrics.COLLECTOR_REQUESTS_TIED, LABEL_TIE, c.block_owners.requests_tied)
    if c.dynamo is not None:  # (its rows read, stored or left out by why: `kvobs import dynamo-trace`'s summary)
        left_out = sum(c.dynamo.summary.left_out.values())
        outcomes = {"stored": c.dynamo.summary.rows - left_out, "left_out": left_out}
        yield _by_label(kvobs_metrics.COLLECTOR_DYNAMO_TRACE_ROWS, LABEL_OUTCOME, outcomes)
        if c.dynamo.join is not None:  # (each outcome at 0 from the start)
            yield _by_label(kvobs_metrics.COLLECTOR_DYNAMO_TRACE_JOINS, LABEL_OUTCOME, c.dynamo.join.outcomes)
