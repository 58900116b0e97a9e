"""OTLP trace exports -> `requests` rows, from vLLM's `llm_request` spans or our engine's.

    ingest = SpanIngest(writer, activity=activity, instance="vllm-a")
    OTLPReceiver(ingest.handle, ...)

One row per `llm_request` span: `gen_ai.request.id`, the span's start (vLLM's arrival time) and end,
first token = start + `gen_ai.latency.time_to_first_token`, `gen_ai.latency.time_in_queue`, prompt and
completion tokens; from our engine also `session.id`, cached tokens and preemptions. `trace_id` joins the
agent step (`steps.trace_id`), `parent_span_id` its exact span. `instance` is the configured name, else the
exporter's `service.instance.id` when it is one of the collector's replica names (`--vllm-url NAME=...`,
`--kv-events NAME=...`; OTel SDKs make up a random id unless told one), else its `service.name`.
A span seen twice (an exporter retry) is stored once. An export is taken whole or not at all: when the store
queue has no room, `handle` raises `Busy` (the exporter retries later) and nothing of it is counted or remembered.
A span whose attributes have the wrong type (a string TTFT) is refused alone and counted (`num_refused`, answered
as OTLP partial success); ids longer than `MAX_ID_BYTES` are cut (`clip_id`, counted in `num_ids_cut`). The agent
SDK's `agent_step` spans sent through the collector are counted by status and error type (`kvobs_agent_steps_total`,
`kvobs_agent_step_failures_total` on the collector's /metrics, what the step-failure alert rule reads); the
steps themselves reach the store from the SDK's recorder, or, for an SDK run with no recorder, from
`collectors.traces.span_steps`, which every span but `llm_request` goes to (when given): agent frameworks' LLM calls
become steps there too. A request span whose session a step
already claimed (by trace or response id) is stored with that session. A KV connector's own spans (LMCache's
`lmcache_mp.server`) become `connector_lookups` rows (`collectors.traces.connector_spans`). `--forward-otlp` passes
every span on.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from collectors.session_activity import SessionActivity
from collectors.traces.agent_spans import first_key, first_present, read_span
from collectors.traces.connector_spans import ConnectorSpans
from collectors.traces.otlp_receiver import Busy
from collectors.traces.span_steps import SpanSteps
from kvobs.identifiers import clip_id
from kvobs.semconv import agent_traces as c
from kvobs.semconv import attributes as a
from kvobs.semconv import lmcache_spans
from kvobs.semconv.spans import SpanName, StepStatus, server_cached_from
from kvobs.store.rows import RequestRecord, SessionRecord
from kvobs.store.writer import StoreWriter

log = logging.getLogger(__name__)

SEEN_SPANS = 100_000


class BadSpan(ValueError):
    """A span attribute of the wrong type: the span is refused alone."""


class RequestTaker(Protocol):
    """What else takes the request rows an export made: ownership by inference (`collectors.block_owners`), which
    joins this wing to the KV wing above both."""

    def add_requests(self, records: list[RequestRecord]) -> None: ...


class SpanIngest:
    def __init__(
        self,
        writer: StoreWriter,
        *,
        activity: SessionActivity | None = None,
        steps: SpanSteps | None = None,
        owners: RequestTaker | None = None,
        instance: str | None = None,
        known_instances: Iterable[str] = (),
    ) -> None:
        self.writer = writer
        self.activity = activity
        self.steps = steps
        self.owners = owners  # ownership by inference: the requests whose stored blocks it ties to sessions
        self.instance = instance
        self.known_instances = frozenset(known_instances)  # the collector's replicas (--vllm-url, --kv-events names)
        self.num_requests = 0
        self.num_duplicates = 0
        self.num_refused = 0  # spans with attributes of the wrong type
        self.num_ids_cut = 0  # session or request ids over MAX_ID_BYTES, cut
        self.connector = ConnectorSpans()  # a KV connector's own spans (LMCache's): its lookups of requests
        self.num_connector_lookups = 0
        self.agent_steps: Counter[str] = Counter()  # status -> steps
        self.agent_step_failures: Counter[str] = Counter()  # error type -> steps
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()  # exports arrive on several server threads

    def handle(self, request: ExportTraceServiceRequest) -> int:
        """Store the export's `llm_request` spans and count its `agent_step` spans; the number of spans refused.

        Raises `Busy` when the store queue cannot take the export now (nothing of it is kept)."""
        with self._lock:
            records, steps, activity, refused, agent_spans, parents = [], [], [], 0, [], []
            connector_spans: list[tuple[str, object, dict]] = []
            keys: dict[bytes, None] = {}
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                instance = self.instance or self._instance_of(resource)
                for scope_spans in resource_spans.scope_spans:
                    connector = scope_spans.scope.name == lmcache_spans.SCOPE
                    for span in scope_spans.spans:
                        key = span.trace_id + span.span_id
                        if key in self._seen or key in keys:
                            self.num_duplicates += 1
                            continue
                        try:
                            if connector:  # a KV connector's own spans: its lookups, loads and stores
                                connector_spans.append((instance, span, attributes(span.attributes)))
                            elif span.name == SpanName.LLM_REQUEST:
                                record, parent = self._request(instance, span)
                                records.append(record)
                                activity.append(record)
                                if parent is not None and record.session_id is not None:
                                    parents.append(SessionRecord(record.session_id, parent_session_id=parent))
                            elif self.steps is not None:
                                agent_spans.append(read_span(span, attributes(span.attributes)))
                            if span.name == SpanName.AGENT_STEP:
                                steps.append(_step_outcome(span))
                        except BadSpan as exc:
                            refused += 1
                            log.debug("span %s refused: %s", span.span_id.hex(), exc)
                            continue
                        keys[key] = None
            lookups = self.connector.take(connector_spans) if connector_spans else []
            if (records or lookups) and not self.writer.offer([*records, *lookups]):
                raise Busy("the collector's store queue is full; retry later")
            for named in parents:  # the session that started the request's (a subagent's caller), as the span says
                self.writer.upsert(named)
            self._remember(keys)
            self.num_refused += refused
            self.num_requests += len(records)
            self.num_connector_lookups += len(lookups)
            for status, error_type in steps:
                self.agent_steps[status] += 1
                if error_type is not None:
                    self.agent_step_failures[error_type] += 1
        if self.steps is not None and records:
            self.steps.add_requests(records)  # (before the calls: a call in this export finds its request)
        if self.owners is not None and records:
            self.owners.add_requests(records)
        if self.steps is not None and agent_spans:
            self.steps.add(agent_spans)
        if self.activity is not None:
            for r in activity:
                if r.trace_id and r.span_id and r.finished_ts is not None:  # (a request span's record has them all)
                    self.activity.add_request(
                        r.trace_id,
                        r.span_id,
                        r.arrival_ts,
                        r.finished_ts,
                        session_id=r.session_id,
                        request_id=r.request_id,
                    )
        if refused:
            log.warning("%d spans with attributes of the wrong type refused (%d so far)", refused, self.num_refused)
        return refused

    def _instance_of(self, resource: dict) -> str:
        """The exporter's `service.instance.id` when it names one of the collector's replicas (OTel SDKs make up a
        random one otherwise), else its `service.name`."""
        replica = resource.get(a.SERVICE_INSTANCE_ID)
        if isinstance(replica, str) and replica in self.known_instances:
            return replica
        return str(resource.get(a.SERVICE_NAME, "unknown"))

    def _remember(self, keys: dict[bytes, None]) -> None:
        for key in keys:
            self._seen[key] = None
        while len(self._seen) > SEEN_SPANS:
            self._seen.popitem(last=False)

    def _request(self, instance: str, span) -> tuple[RequestRecord, str | None]:
        """The span's request row, and the session that started its session where the span names one."""
        attrs = attributes(span.attributes)
        start, end = span.start_time_unix_nano / 1e9, span.end_time_unix_nano / 1e9
        ttft = _number(attrs, a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN)
        trace_id, span_id = span.trace_id.hex(), span.span_id.hex()
        reasons = attrs.get(a.GEN_AI_RESPONSE_FINISH_REASONS) or [None]
        if isinstance(reasons, str):
            reasons = [reasons]
        if not isinstance(reasons, list) or not isinstance(reasons[0], str | None):
            raise BadSpan(f"{a.GEN_AI_RESPONSE_FINISH_REASONS} is {reasons!r}, not a list of strings")
        request_id = self._id(attrs.get(a.GEN_AI_REQUEST_ID)) or span_id
        session_id = self._id(first_present(attrs, c.SESSION_KEYS))
        if session_id is None and self.activity is not None:
            session_id = self.activity.claimed(trace_id, request_id)  # an agent step already named it
        cached_key = first_key(attrs, c.CACHE_READ_KEYS)
        cached = None if cached_key is None else _count(attrs, cached_key)
        record = RequestRecord(
            request_id=request_id,
            instance=instance,
            session_id=session_id,
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=span.parent_span_id.hex() or None,
            arrival_ts=start,
            first_token_ts=None if ttft is None else start + ttft,
            finished_ts=end,
            queue_s=_number(attrs, a.GEN_AI_LATENCY_TIME_IN_QUEUE),
            prompt_tokens=_count(attrs, a.GEN_AI_USAGE_PROMPT_TOKENS),
            cached_tokens=cached,
            completion_tokens=_count(attrs, a.GEN_AI_USAGE_COMPLETION_TOKENS),
            num_preemptions=_count(attrs, a.KV_REQUEST_NUM_PREEMPTIONS) or 0,
            finish_reason=reasons[0],
            cached_from=server_cached_from(cached),
        )
        return record, self._id(attrs.get(a.SESSION_PARENT_ID))

    def _id(self, value) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise BadSpan(f"an id is {type(value).__name__}, not a string")
        cut = clip_id(str(value))
        if cut != str(value):
            self.num_ids_cut += 1
        return cut


def _step_outcome(span) -> tuple[str, str | None]:
    """(status, error type or None) of an `agent_step` span."""
    if span.status.code == Status.STATUS_CODE_ERROR:
        error_type = attributes(span.attributes).get(a.ERROR_TYPE, "unknown")
        return StepStatus.ERROR.value, clip_id(str(error_type))
    return StepStatus.OK.value, None


def _number(attrs: dict, key: str, kind: type = float) -> float | int | None:
    """A numeric attribute (None when absent); BadSpan when it is not a finite number of that kind."""
    value = attrs.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise BadSpan(f"{key} is {value!r}, not {'an integer' if kind is int else 'a number'}")
    if value != value or value in (float("inf"), float("-inf")) or abs(value) >= 2**63:
        raise BadSpan(f"{key} is {value!r}, out of range")
    return value


def _count(attrs: dict, key: str) -> int | None:
    """An integer attribute (None when absent); BadSpan when it is not an integer in range."""
    value = _number(attrs, key, int)
    return None if value is None else int(value)


def attributes(key_values) -> dict:
    """OTLP KeyValue list -> plain dict (arrays as lists)."""
    return {kv.key: any_value(kv.value) for kv in key_values}


def any_value(value: AnyValue):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return None if kind is None else getattr(value, kind)
