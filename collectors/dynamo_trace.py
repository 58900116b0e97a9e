"""NVIDIA Dynamo's request traces into the store: `kvobs import dynamo-trace FILE...`.

    summary = import_dynamo_trace(store, [Path("/tmp/dynamo-request-trace.000000.jsonl.gz")])

Dynamo's frontend writes one `request_end` row per chat or completion request when `DYN_REQUEST_TRACE=1`
(schema `dynamo.request.trace.v1`, JSONL or rolling `.jsonl.gz` shards; its docs' "Request Replay Tracing"), with
`agent_context` (`session_id`, `parent_session_id`) where the request carried session headers, and `tool_end` rows
from an agent harness. Each `request_end` row is a request (its arrival, time to first token, end, tokens and
cached tokens as Dynamo counted them) and, in a session, that session's next step; a subagent's session is the
child of its parent's; a session's tool calls that ended between two of its steps are the pause before the later
one. Rows are read in the order of their times, whatever the shards' order; a row that is not JSON, not of this
schema or lacks what a request needs is left out alone and counted by why.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from collectors.values import count as _count
from collectors.values import text as _text
from kvobs.identifiers import clip_id
from kvobs.semconv.spans import CachedFrom, SessionSource, StepStatus
from kvobs.store import Store, StoreWriter
from kvobs.store.rows import RequestRecord, SessionRecord, StepRecord

log = logging.getLogger(__name__)

SCHEMA = "dynamo.request.trace.v1"
REQUEST_END, TOOL_END = "request_end", "tool_end"
DEFAULT_INSTANCE = "dynamo"  # the requests' replica where a row names no worker


class DynamoTraceError(ValueError):
    """A file cannot be read, or holds no row of the schema."""


@dataclass
class DynamoTraceSummary:
    """What an import read and stored, and what it left out (by why)."""

    rows: int = 0
    requests: int = 0
    sessions: int = 0
    steps: int = 0
    tools: int = 0
    left_out: Counter = field(default_factory=Counter)

    def describe(self) -> str:
        said = (
            f"{self.rows:,} rows: {self.requests:,} requests, {self.steps:,} steps of {self.sessions:,} sessions, "
            f"{self.tools:,} tool calls"
        )
        if self.left_out:
            said += "; left out: " + ", ".join(f"{n:,} {why}" for why, n in sorted(self.left_out.items()))
        return said


@dataclass(frozen=True)
class _Request:
    record: RequestRecord
    parent_session_id: str | None
    named: tuple[int, ...] = ()  # its prompt's blocks as Dynamo names them (`replay.input_sequence_hashes`)
    block_size: int | None = None  # the tokens a named block holds (`replay.trace_block_size`)
    worker: str | None = None  # the worker Dynamo's router chose, as the row names it (`_worker`)


@dataclass(frozen=True)
class _Tool:
    session_id: str
    name: str
    start: float
    end: float
    status: str


def import_dynamo_trace(store: Store, paths: Iterable[Path], *, instance: str = DEFAULT_INSTANCE) -> DynamoTraceSummary:
    """Store the shards' requests, sessions, steps and tool pauses (`instance`: the requests' replica name, where a
    row names no worker)."""
    summary = DynamoTraceSummary()
    requests, tools = parse_rows(_rows(paths, summary), summary, instance)
    if summary.rows and not requests:
        raise DynamoTraceError(f"no {REQUEST_END} row of {SCHEMA} in {', '.join(str(p) for p in paths)}")
    writer = StoreWriter(store)
    try:
        SessionSteps(writer, summary).add(requests, tools)
    finally:
        writer.close()
    return summary


def parse_rows(rows: Iterable[dict], summary: DynamoTraceSummary, instance: str) -> tuple[list[_Request], list[_Tool]]:
    """The requests and tool calls of rows of the schema; a row that is neither, or lacks what it needs, counted."""
    requests, tools = [], []
    for row in rows:
        kind = row.get("event_type")
        if kind == REQUEST_END:
            request = _request(row, instance)
            if request is None:
                summary.left_out["request rows without an id or arrival"] += 1
            else:
                requests.append(request)
        elif kind == TOOL_END:
            tool = _tool(row)
            if tool is None:
                summary.left_out["tool rows without a session or times"] += 1
            else:
                tools.append(tool)
        else:
            summary.left_out[f"rows of event type {str(kind)[:40]!r}"] += 1
    return requests, tools


def _rows(paths: Iterable[Path], summary: DynamoTraceSummary) -> Iterator[dict]:
    for path in paths:
        try:
            with open_shard(path) as lines:
                yield from schema_rows(lines, summary)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise DynamoTraceError(f"{path}: {exc}") from exc


def schema_rows(lines: Iterable[str], summary: DynamoTraceSummary) -> Iterator[dict]:
    """The rows of the schema among `lines` (the JSONL sink's envelope opened); the rest counted by why."""
    for line in lines:
        if not line.strip():
            continue
        summary.rows += 1
        try:
            row = json.loads(line)
        except ValueError:
            summary.left_out["lines that are not JSON"] += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("event"), dict):
            row = row["event"]  # the JSONL sink's envelope: {"timestamp": ..., "event": {...}}
        if not isinstance(row, dict) or row.get("schema") != SCHEMA:
            summary.left_out[f"rows not of {SCHEMA}"] += 1
            continue
        yield row


def open_shard(path: Path) -> TextIO:
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def _request(row: dict, instance: str) -> _Request | None:
    request, context = row.get("request"), row.get("agent_context") or {}
    if not isinstance(request, dict) or not isinstance(context, dict):
        return None
    request_id, received_ms = _text(request.get("request_id")), _number(request.get("request_received_ms"))
    if request_id is None or received_ms is None:
        return None
    arrival = received_ms / 1000
    total_ms, ttft_ms, event_ms = (_number(request.get(k)) for k in ("total_time_ms", "ttft_ms", "event_time_unix_ms"))
    event_ms = event_ms if event_ms is not None else _number(row.get("event_time_unix_ms"))
    finished = arrival + total_ms / 1000 if total_ms is not None else None if event_ms is None else event_ms / 1000
    replay = request.get("replay")
    replay = replay if isinstance(replay, dict) else {}
    prompt = _count(request.get("input_tokens"))
    cached = _count(request.get("cached_tokens"))
    finish = request.get("finish_reason_metadata")
    worker = _worker(request)
    record = RequestRecord(
        request_id=request_id,
        instance=worker or instance,
        arrival_ts=arrival,
        session_id=_text(context.get("session_id")),
        first_token_ts=None if ttft_ms is None else arrival + ttft_ms / 1000,
        finished_ts=finished,
        queue_s=None if (wait := _number(request.get("prefill_wait_time_ms"))) is None else wait / 1000,
        prompt_tokens=prompt if prompt is not None else _count(replay.get("input_length")),
        cached_tokens=cached,
        completion_tokens=_count(request.get("output_tokens")),
        finish_reason=_text(finish.get("finish_reason")) if isinstance(finish, dict) else None,
        cached_from=None if cached is None else CachedFrom.SERVER.value,
    )
    named = replay.get("input_sequence_hashes")
    named = tuple(named) if isinstance(named, list) and all(_is_u64(h) for h in named) else ()
    return _Request(
        record, _text(context.get("parent_session_id")), named, _count(replay.get("trace_block_size")), worker
    )


def _is_u64(value) -> bool:
    return type(value) is int and 0 <= value < 2**64


def _worker(request: dict) -> str | None:
    """The decode worker Dynamo's router chose, where the row names it (its `worker` block)."""
    worker = request.get("worker")
    if not isinstance(worker, dict):
        return None
    worker_id = worker.get("decode_worker_id", worker.get("worker_id"))
    return None if worker_id is None else clip_id(f"worker-{worker_id}")


def _tool(row: dict) -> _Tool | None:
    tool, context = row.get("tool"), row.get("agent_context") or {}
    if not isinstance(tool, dict) or not isinstance(context, dict):
        return None
    session = _text(context.get("session_id")) or _text(row.get("session_id"))
    end_ms = _number(tool.get("ended_at_unix_ms"))
    end_ms = end_ms if end_ms is not None else _number(row.get("event_time_unix_ms"))
    start_ms = _number(tool.get("started_at_unix_ms"))
    duration = _number(tool.get("duration_ms"))
    if start_ms is None and end_ms is not None and duration is not None:
        start_ms = end_ms - duration
    if session is None or start_ms is None or end_ms is None:
        return None
    name = _text(tool.get("tool_class")) or _text(tool.get("name")) or "tool"
    failed = str(tool.get("status", "succeeded")).lower() not in ("succeeded", "success", "ok")
    return _Tool(session, name, start_ms / 1000, end_ms / 1000, (StepStatus.ERROR if failed else StepStatus.OK).value)


@dataclass
class _Session:
    next_index: int = 0
    last_end: float | None = None  # its latest request's end (or arrival): a tool that ended before is no pause
    started_at: float | None = None
    ended_at: float | None = None
    parent_session_id: str | None = None
    tools: list[_Tool] = field(default_factory=list)  # tool calls not yet in a pause before a step


class SessionSteps:
    """Requests and tool calls written as requests, each session's steps (one a request, in arrival order, with the
    tool calls that ended in the pause before it) and the sessions; kept across calls, so rows that come in parts (a
    directory of shards followed as Dynamo writes them) make the steps one import of them all would."""

    def __init__(self, writer: StoreWriter, summary: DynamoTraceSummary) -> None:
        self.writer, self.summary = writer, summary
        self.sessions: dict[str, _Session] = defaultdict(_Session)

    def add(self, requests: list[_Request], tools: list[_Tool]) -> None:
        for tool in sorted(tools, key=lambda t: t.end):
            self.sessions[tool.session_id].tools.append(tool)
        touched: dict[str, _Session] = {}
        for request in sorted(requests, key=lambda r: r.record.arrival_ts):
            r = request.record
            self.writer.add(r)
            self.summary.requests += 1
            if r.session_id is None:
                continue
            session = touched[r.session_id] = self.sessions[r.session_id]
            pause = [t for t in session.tools if (session.last_end is None or t.end > session.last_end)]
            pause = [t for t in pause if t.end <= r.arrival_ts]
            self.writer.add(_step(r.session_id, session.next_index, r, pause))
            self.summary.steps += 1
            self.summary.tools += len(pause)
            session.next_index += 1
            session.last_end = r.finished_ts if r.finished_ts is not None else r.arrival_ts
            session.tools = [t for t in session.tools if t.end > session.last_end]  # (the rest can be no pause now)
            session.started_at = r.arrival_ts if session.started_at is None else session.started_at
            if r.finished_ts is not None:
                session.ended_at = max(r.finished_ts, session.ended_at or r.finished_ts)
            session.parent_session_id = session.parent_session_id or request.parent_session_id
        for session_id, session in touched.items():
            self.writer.upsert(
                SessionRecord(
                    session_id,
                    started_at=session.started_at,
                    ended_at=session.ended_at,
                    num_steps=session.next_index,
                    num_failed_steps=0,
                    source=SessionSource.DYNAMO.value,
                    parent_session_id=session.parent_session_id,
                )
            )
        self.summary.sessions = sum(1 for s in self.sessions.values() if s.next_index)


def _step(session_id: str, index: int, r: RequestRecord, pause: list[_Tool]) -> StepRecord:
    tools = [{"name": t.name, "start": t.start, "end": t.end, "status": t.status, "error_type": None} for t in pause]
    return StepRecord(
        session_id=session_id,
        step_index=index,
        started_at=r.arrival_ts,
        status=StepStatus.OK.value,  # a row says how the request ended, never that it failed
        ended_at=r.finished_ts,
        ttft_s=None if r.first_token_ts is None else r.first_token_ts - r.arrival_ts,
        e2e_s=None if r.finished_ts is None else r.finished_ts - r.arrival_ts,
        prompt_tokens=r.prompt_tokens,
        cached_tokens=r.cached_tokens,
        completion_tokens=r.completion_tokens,
        request_id=r.request_id,
        tools=json.dumps(tools) if tools else None,
    )


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        return None
    return float(value)
