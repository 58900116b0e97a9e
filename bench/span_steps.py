"""How fast the collector makes agent steps of agent frameworks' spans (`collectors.traces.span_steps`), into each
backend.

The payload: `--conversations` agent conversations of `--steps` steps, traced as the OpenTelemetry GenAI
conventions say (an `invoke_agent` span with `gen_ai.conversation.id`; per step a `chat` span with its response
id and usage, then an `execute_tool` span), and the server's `llm_request` span per step, in OTLP exports of
`--batch` spans in the order a batch span processor sends them (a conversation's children before its agent span).
Stages, each over the same exports on one thread (the receiver's), then until the store writer committed all:

- requests only: span ingest as before agent spans were read (the `llm_request` spans stored, the rest skipped),
  rows dropped: the baseline;
- + agent steps: every span read, kept per trace, each call decided once its parents arrived, rows dropped;
- + SQLite / PostgreSQL (the local server, a fresh schema) / chDB: everything, into the store.

Each prints spans/s, steps/s and time against the baseline, and the CPU per span (user + system, every thread).

    python bench/span_steps.py [--conversations 2000] [--steps 6] [--batch 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import uuid

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span
from results import Result, process_cpu_s, record  # bench/ is on sys.path when a script in it runs
from sqlalchemy import create_engine, text

from collectors.session_activity import SessionActivity
from collectors.traces.span_ingest import SpanIngest
from collectors.traces.span_steps import SpanSteps
from kvobs.semconv import attributes as a
from kvobs.store import StoreWriter, open_store

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
STAGES = ("requests only", "+ agent steps", "+ SQLite", "+ PostgreSQL", "+ chDB")


def _kv(key: str, value) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(int_value=value))


def _span(trace: bytes, parent: bytes | None, name: str, start: float, end: float, attrs: dict) -> Span:
    return Span(
        trace_id=trace,
        span_id=random.randbytes(8),
        parent_span_id=parent or b"",
        name=name,
        start_time_unix_nano=int(start * 1e9),
        end_time_unix_nano=int(end * 1e9),
        attributes=[_kv(k, v) for k, v in attrs.items()],
    )


def conversation_spans(n: int, steps: int, t0: float) -> tuple[list[Span], list[Span]]:
    """(the agent's spans, the server's) of one conversation, each in the order it ends."""
    trace, conversation = random.randbytes(16), f"conv-{n:06d}"
    agent_id = random.randbytes(8)
    agent, server, t = [], [], t0
    for step in range(steps):
        response = f"chatcmpl-{uuid.uuid4().hex}"
        chat = _span(
            trace,
            agent_id,
            "chat smollm2",
            t,
            t + 0.4,
            {
                a.GEN_AI_OPERATION_NAME: "chat",
                a.GEN_AI_RESPONSE_ID: response,
                a.GEN_AI_USAGE_INPUT_TOKENS: 300 + 40 * step,
                a.GEN_AI_USAGE_OUTPUT_TOKENS: 24,
            },
        )
        server.append(
            _span(
                trace,
                None,
                "llm_request",
                t + 0.01,
                t + 0.39,
                {
                    a.GEN_AI_REQUEST_ID: response,
                    a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: 0.05,
                    a.GEN_AI_USAGE_PROMPT_TOKENS: 300 + 40 * step,
                    a.GEN_AI_USAGE_COMPLETION_TOKENS: 24,
                },
            )
        )
        tool = _span(
            trace,
            agent_id,
            "execute_tool search",
            t + 0.41,
            t + 0.9,
            {a.GEN_AI_OPERATION_NAME: "execute_tool", a.GEN_AI_TOOL_NAME: "search"},
        )
        agent += [chat, tool]
        t += 1.0
    root = Span(
        trace_id=trace,
        span_id=agent_id,
        name="invoke_agent planner",
        start_time_unix_nano=int(t0 * 1e9),
        end_time_unix_nano=int(t * 1e9),
        attributes=[
            _kv(a.GEN_AI_OPERATION_NAME, "invoke_agent"),
            _kv(a.GEN_AI_CONVERSATION_ID, conversation),
            _kv(a.GEN_AI_AGENT_NAME, "planner"),
        ],
    )
    return agent + [root], server


def exports(conversations: int, steps: int, batch: int) -> tuple[list[ExportTraceServiceRequest], int]:
    random.seed(0)
    agent, server = [], []
    for n in range(conversations):
        mine, theirs = conversation_spans(n, steps, 1.8e9 + n * 0.25)
        agent += mine
        server += theirs
    requests = []
    for service, spans in (("travel-agent", agent), ("kvobs-engine", server)):
        for i in range(0, len(spans), batch):
            request = ExportTraceServiceRequest()
            resource_spans = ResourceSpans()
            resource_spans.resource.attributes.append(_kv(a.SERVICE_NAME, service))
            resource_spans.scope_spans.add().spans.extend(spans[i : i + batch])
            request.resource_spans.append(resource_spans)
            requests.append(request)
    random.Random(1).shuffle(requests)  # the agent's and the server's exports interleave
    return requests, len(agent) + len(server)


class _NullWriter:
    def add(self, *_, **__) -> bool:
        return True

    offer = add_many = insert_missing = upsert = add

    def close(self, **_) -> None:
        pass


def time_stage(stage: str, requests: list[ExportTraceServiceRequest], workdir: str, run: int) -> tuple[float, float]:
    store, schema = None, None
    if stage in ("requests only", "+ agent steps"):
        writer = _NullWriter()
    else:
        if stage == "+ SQLite":
            url = f"sqlite:///{workdir}/steps-{run}.db"
        elif stage == "+ PostgreSQL":
            schema = f"kvobs_bench_{uuid.uuid4().hex[:10]}"
            with create_engine(POSTGRES).begin() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            url = f"{POSTGRES}?options=-csearch_path%3D{schema}"
        else:
            url = f"chdb:///{workdir}/ch-{run}"
        store = open_store(url)
        writer = StoreWriter(store)
    activity = SessionActivity()
    steps = None
    if stage != "requests only":
        counts = (lambda ids: store.lookups.session_step_counts(ids)) if store is not None else None
        steps = SpanSteps(writer, activity=activity, step_counts=counts)
    ingest = SpanIngest(writer, activity=activity, steps=steps, instance="engine")
    cpu, start = process_cpu_s(), time.perf_counter()
    for i, request in enumerate(requests):
        ingest.handle(request)
        if steps is not None and i % 8 == 7:
            steps.settle()  # the collector's tick
    if steps is not None:
        steps.settle(final=True)
    writer.close(timeout_s=600)
    wall, cpu = time.perf_counter() - start, process_cpu_s() - cpu
    if store is not None:
        store.close()
    if schema is not None:
        with create_engine(POSTGRES).begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    return wall, cpu


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    requests, num_spans = exports(args.conversations, args.steps, args.batch)
    num_steps = args.conversations * args.steps
    timings: dict[str, list[tuple[float, float]]] = {s: [] for s in STAGES}
    with tempfile.TemporaryDirectory() as workdir:
        for run in range(args.repeats):
            for stage in STAGES:
                timings[stage].append(time_stage(stage, requests, workdir, run))
    wall = {s: statistics.median(t for t, _ in timings[s]) for s in STAGES}
    cpu = {s: statistics.median(c for _, c in timings[s]) for s in STAGES}
    base = wall[STAGES[0]]
    print(
        f"\nAgent spans: {num_spans:,} spans ({num_steps:,} steps, {args.conversations:,} conversations) in "
        f"{len(requests):,} exports, median of {args.repeats}"
    )
    print(f"{'stage':<16} {'spans/s':>10} {'steps/s':>10} {'time vs requests only':>22} {'CPU us/span':>12}")
    results = []
    for stage in STAGES:
        t = wall[stage]
        print(
            f"{stage:<16} {num_spans / t:>10,.0f} {num_steps / t:>10,.0f} {t / base:>21.2f}x "
            f"{cpu[stage] / num_spans * 1e6:>12.1f}"
        )
        results.append(Result("span_steps", stage, num_spans / t, "spans/s", base / t, "requests only"))
    return results


if __name__ == "__main__":
    record(main)
