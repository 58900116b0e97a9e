"""OTLP trace exports -> `requests` rows, from vLLM's `llm_request` spans or our engine's.

    ingest = SpanIngest(writer, activity=activity, instance="vllm-a")
    OTLPReceiver(ingest.handle, ...)

One row per `llm_request` span: `gen_ai.request.id`, the span's start (vLLM's arrival time) and end,
first token = start + `gen_ai.latency.time_to_first_token`, `gen_ai.latency.time_in_queue`, prompt and
completion tokens; from our engine also `session.id`, cached tokens and preemptions. `trace_id` joins the
agent step (`steps.trace_id`), `parent_span_id` its exact span. `instance` is the configured name, else the
exporter's `service.name`. A span seen twice (an exporter retry) is stored once. The agent SDK's `agent_step`
spans sent through the collector are counted by status and error type (`kvobs_agent_steps_total`,
`kvobs_agent_step_failures_total` on the collector's /metrics, what the step-failure alert rule reads); the
steps themselves reach the store from the SDK's recorder. Other spans (vLLM's startup spans) are not stored;
`--forward-otlp` passes every span on.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from collectors.session_activity import SessionActivity
from kvobs.semconv import attributes as a
from kvobs.semconv.spans import SpanName, StepStatus
from kvobs.store.rows import RequestRecord
from kvobs.store.writer import StoreWriter

log = logging.getLogger(__name__)

SERVICE_NAME = "service.name"
SEEN_SPANS = 100_000


class SpanIngest:
    def __init__(self, writer: StoreWriter, *, activity: SessionActivity | None = None,
                 instance: str | None = None) -> None:  # fmt: skip
        self.writer = writer
        self.activity = activity
        self.instance = instance
        self.num_requests = 0
        self.num_duplicates = 0
        self.agent_steps: Counter[str] = Counter()  # status -> steps
        self.agent_step_failures: Counter[str] = Counter()  # error type -> steps
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def handle(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            instance = self.instance or str(resource.get(SERVICE_NAME, "unknown"))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    if span.name == SpanName.LLM_REQUEST and self._first_time(span):
                        self._request(instance, span)
                    elif span.name == SpanName.AGENT_STEP and self._first_time(span):
                        self._step(span)

    def _first_time(self, span) -> bool:
        key = span.trace_id + span.span_id
        if key in self._seen:
            self.num_duplicates += 1
            return False
        self._seen[key] = None
        if len(self._seen) > SEEN_SPANS:
            self._seen.popitem(last=False)
        return True

    def _step(self, span) -> None:
        if span.status.code == Status.STATUS_CODE_ERROR:
            self.agent_steps[StepStatus.ERROR.value] += 1
            self.agent_step_failures[str(attributes(span.attributes).get(a.ERROR_TYPE, "unknown"))] += 1
        else:
            self.agent_steps[StepStatus.OK.value] += 1

    def _request(self, instance: str, span) -> None:
        attrs = attributes(span.attributes)
        start, end = span.start_time_unix_nano / 1e9, span.end_time_unix_nano / 1e9
        ttft = attrs.get(a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN)
        trace_id, span_id = span.trace_id.hex(), span.span_id.hex()
        session = attrs.get(a.SESSION_ID)
        reasons = attrs.get(a.GEN_AI_RESPONSE_FINISH_REASONS) or [None]
        self.writer.add(RequestRecord(
            request_id=str(attrs.get(a.GEN_AI_REQUEST_ID) or span_id),
            instance=instance,
            session_id=session,
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=span.parent_span_id.hex() or None,
            arrival_ts=start,
            first_token_ts=None if ttft is None else start + ttft,
            finished_ts=end,
            queue_s=attrs.get(a.GEN_AI_LATENCY_TIME_IN_QUEUE),
            prompt_tokens=attrs.get(a.GEN_AI_USAGE_PROMPT_TOKENS),
            cached_tokens=attrs.get(a.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS),
            completion_tokens=attrs.get(a.GEN_AI_USAGE_COMPLETION_TOKENS),
            num_preemptions=attrs.get(a.KV_REQUEST_NUM_PREEMPTIONS, 0),
            finish_reason=reasons[0],
        ))  # fmt: skip
        self.num_requests += 1
        if self.activity is not None:
            self.activity.add_request(trace_id, span_id, start, end, session_id=session)


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
