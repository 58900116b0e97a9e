"""Agent steps from agent frameworks' spans: one step per LLM call, in the session its trace names.

    steps = SpanSteps(writer, activity=activity, step_counts=store.lookups.session_step_counts)
    steps.add(spans)          # every span of an export (collectors.traces.agent_spans.TraceSpan), as it arrives
    steps.settle()            # each tick: write the calls that are ready; settle(final=True) at shutdown

Spans of one trace arrive in several exports, children before their parents (a parent ends last), and an
exporter's retry sends some twice (span ingest drops those). An LLM call is decided once every ancestor up to its
trace's root has arrived, or `settle_s` after it arrived (a parent in a process that exports elsewhere never
comes); then it is one `steps` row, written once:
- session: the nearest session named on the call or an ancestor (`session.id`, `gen_ai.conversation.id`, a
  Traceloop association property), else the call's trace id (the trace of its outermost agent span, or of the
  call alone); once a call of a trace fell back to its trace id, the trace's later calls do too, so a
  conversation is never split. `sessions.source` says which convention the call was written in; `agent_name`
  the outermost agent (written when its span arrives, usually after the calls inside it).
- index: the session's next (calls decided together in start order; a session seen before this collector
  started continues from the store's count).
- status and `error_type` from the call's span (`collectors.traces.agent_spans`), kept apart from slowness.
- the tool pause before it: from the end of the session's previous call to this call's start; `tools` lists the
  tool spans of the same trace and session inside it (name, start, end, status, error type) as JSON.
- `request_id`: the server request the call made, found among the request spans seen (`collectors.traces.request_join`:
  an id in its reply, its trace context, else the only request its time and token counts fit), and
  `request_join`, how, or why none was (`StepJoin`); `response_id`: the reply's id that joined it, else the
  reply's first id. A call whose request span has not arrived yet (a server exports it after the request ends)
  waits up to `join_wait_s`, and the later calls of its session with it (indexes go in order). The step claims
  its request by that id and by its trace (`SessionActivity.claim`), so the request's rows and idle losses are
  the session's. Steps joined and not, by method and convention, are counted (`joins`); where most of a
  convention's steps are not joined, a log line says why, at most every `WARN_EVERY_S`. A joined request whose own
  span said no cached tokens (vLLM's) takes the count the call's reply gave (`cached_from` reply), where both
  name the same prompt tokens; what became of each is counted (`cached_fills`).
An LLM span inside another is the same call traced twice (LlamaIndex): the outermost one is the step, with the ids
and token counts of those inside it. Calls under a kvobs SDK `agent_step` span are not steps of their own: the SDK's
step is. Where the SDK runs with no
recorder (its spans say `kvobs.agent.recorded` false: the agent has an OTLP endpoint and no store), its steps and
session ends are written from its spans here, as its recorder would have written them (source `sdk`).
Traces are kept until `keep_s` after their last span (bounded by `max_traces`, oldest dropped first). A plain span
(no LLM call, tool or agent) opening a trace is not kept: spans end children first, so the parents that matter
arrive after the calls; the rest of the world's spans (a server's, an HTTP client's) never fill the memory.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from collectors.session_activity import SessionActivity
from collectors.traces.agent_spans import AGENT, LLM, TraceSpan
from collectors.traces.agent_trace import Trace
from collectors.traces.request_join import WAITS_FOR_REQUESTS, Found, RequestJoin
from kvobs.analytics.steps import JOIN_WORDS, SourceJoin
from kvobs.semconv.spans import CachedFill, CachedFrom, SessionSource, StepStatus
from kvobs.store.rows import UNSET, RequestRecord, SessionRecord, StepRecord
from kvobs.store.writer import StoreWriter

log = logging.getLogger(__name__)

SETTLE_S = 10.0
JOIN_WAIT_S = 20.0  # a server's batch exporter sends a request span within seconds of its end (OTel's default: 5 s)
WARN_EVERY_S = 300.0
WARN_AFTER = 5  # steps of a convention decided before its join rate is worth a log line
KEEP_S = 600.0
MAX_TRACES = 20_000


@dataclass
class _Session:
    next_index: int
    num_failed: int
    last_end: float | None = None
    agent_name: str | None = None


class SpanSteps:
    def __init__(
        self,
        writer: StoreWriter,
        *,
        activity: SessionActivity | None = None,
        step_counts: Callable[[list[str]], dict[str, tuple[int, int]]] | None = None,
        settle_s: float = SETTLE_S,
        join_wait_s: float = JOIN_WAIT_S,
        keep_s: float = KEEP_S,
        max_traces: int = MAX_TRACES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.writer = writer
        self.activity = activity
        self.step_counts = step_counts
        self.settle_s = settle_s
        self.join_wait_s = join_wait_s
        self.requests = RequestJoin()
        self.keep_s = keep_s
        self.max_traces = max_traces
        self.clock = clock
        self.statuses: Counter[str] = Counter()  # steps written, by status (with the SDK's on kvobs_agent_steps_total)
        self.failures: Counter[str] = Counter()  # failed steps written, by error type
        self.num_sdk_calls = 0  # LLM calls under the kvobs SDK's agent_step spans (the SDK writes those)
        self.num_nested_calls = 0  # LLM spans inside another LLM span: the same call, folded into the outer one
        self.num_traces_dropped = 0  # traces dropped with calls still waiting (over max_traces)
        self.num_plain_skipped = 0  # plain spans of traces with no agent span (not kept)
        self.by_source: Counter[str] = Counter()  # steps written, by convention (sessions.source)
        self.joins: Counter[tuple[str, str]] = Counter()  # (request_join, convention) -> steps written
        self.cached_fills: Counter[str] = Counter()  # joined requests with no cached tokens, by `CachedFill`
        self._warned: dict[str, float] = {}  # convention -> when its join rate was last logged
        self._traces: OrderedDict[str, Trace] = OrderedDict()
        self._sessions: dict[str, _Session] = {}
        self._sdk_steps: list[TraceSpan] = []  # the SDK's step spans to write (no recorder did)
        self._sdk_sessions: list[TraceSpan] = []  # the SDK's ended session spans to write
        self._lock = threading.Lock()

    def add(self, spans: Iterable[TraceSpan]) -> None:
        now = self.clock()
        with self._lock:
            for span in spans:
                if span.sdk_unrecorded:  # the SDK's own step or session, written by no recorder: ours to make
                    (self._sdk_steps if span.sdk_step else self._sdk_sessions).append(span)
                trace = self._traces.get(span.trace_id)
                if trace is None:
                    if span.role is None:  # a parent ends after its children: a trace with no call yet has none
                        self.num_plain_skipped += 1  # (a server's own spans, kvcache spans, an agent's HTTP spans)
                        continue
                    trace = self._traces[span.trace_id] = Trace()
                trace.spans[span.span_id] = span
                trace.last_seen = now
                self._traces.move_to_end(span.trace_id)
                if span.role == LLM:
                    trace.waiting[span.span_id] = now
                    self.requests.name(span)
                elif span.role == AGENT:
                    trace.agents.append(span)
            while len(self._traces) > self.max_traces:
                _, dropped = self._traces.popitem(last=False)
                if dropped.waiting:
                    self.num_traces_dropped += 1
                    log.warning(
                        "a trace with %d LLM calls not yet decided dropped (over %d traces kept)",
                        len(dropped.waiting),
                        self.max_traces,
                    )

    def add_requests(self, records) -> None:
        """The server requests span ingest stored (`RequestRecord`s): what calls are joined to."""
        with self._lock:
            self.requests.add(records)

    def settle(self, *, final: bool = False) -> int:
        """Write the steps of every call that is ready (all when `final`); returns how many were written."""
        now = self.clock()
        with self._lock:
            ready = []
            for trace in self._traces.values():
                for span_id, arrived in list(trace.waiting.items()):
                    if final or now - arrived >= self.settle_s or trace.rooted(span_id):
                        ready.append((trace, trace.spans[span_id], arrived))
                        del trace.waiting[span_id]
            ready.sort(key=lambda r: r[1].start)
            written = self._decide(ready, now=now, final=final) + self._write_sdk()
            self._name_agents()
            horizon = now - self.keep_s
            while self._traces and (t := next(iter(self._traces.values()))).last_seen < horizon and not t.waiting:
                self._traces.popitem(last=False)
        return written

    # ---- internals -------------------------------------------------------------------------------------------
    def _name_agents(self) -> None:
        """Agent spans end after the calls inside them: a session's agent name is written when its span arrives."""
        for trace in self._traces.values():
            if not trace.agents:
                continue
            outermost = min(trace.agents, key=lambda s: s.start)
            trace.agents.clear()
            session_id = trace.fallback or outermost.session_id
            state = self._sessions.get(session_id) if session_id else None
            if session_id and state is not None and state.agent_name is None and outermost.agent_name:
                state.agent_name = outermost.agent_name
                self.writer.upsert(SessionRecord(session_id, agent_name=outermost.agent_name))

    def _decide(self, ready: list[tuple[Trace, TraceSpan, float]], *, now: float, final: bool) -> int:
        calls, held = [], set()  # held: sessions with a call waiting for its request (their later calls wait too)
        for trace, call, arrived in ready:
            chain = trace.ancestors(call)
            if call.sdk_call or any(s.sdk_step for s in chain):  # its step is the SDK's: only its request's count
                self.num_sdk_calls += self._fill_sdk_call(trace, call, arrived, now, final)
                continue
            if any(s.role == LLM for s in chain):  # the same call traced again inside its outer span: part of it
                self.num_nested_calls += 1
                continue
            call = trace.with_nested(call)
            key = trace.session_of(call, chain, decide=False)
            found = None if key in held else self.requests.find(call)
            if found is None or (not found.joined and self._may_wait(found, arrived, now, final)):
                held.add(key)
                trace.waiting[call.span_id] = arrived
                continue
            calls.append((trace, call, chain, trace.session_of(call, chain), found))
        self._seed({session for *_, session, _ in calls})
        for trace, call, chain, session_id, found in calls:
            self._write(trace, call, chain, session_id, found)
        self._warn_unjoined(now)
        return len(calls)

    def _fill_sdk_call(self, trace: Trace, call: TraceSpan, arrived: float, now: float, final: bool) -> bool:
        """An LLM call of a kvobs SDK step (the SDK or its recorder writes the step): its request takes the cached
        count the reply gave, as any joined call's does; False while it waits for its request span."""
        found = self.requests.find(call)
        if not found.joined and self._may_wait(found, arrived, now, final):
            trace.waiting[call.span_id] = arrived
            return False
        if found.unfilled is not None:
            self._fill_cached(found.unfilled, call)
        return True

    def _may_wait(self, found: Found, arrived: float, now: float, final: bool) -> bool:
        """Whether a call not joined yet waits for more request spans."""
        return not final and found.method in WAITS_FOR_REQUESTS and now - arrived < self.join_wait_s

    def _warn_unjoined(self, now: float) -> None:
        """A log line where most steps of a convention are not joined to a server request: the KV story of those
        steps cannot be told (at most every `WARN_EVERY_S` a convention)."""
        for source in {source for _, source in self.joins}:
            join = SourceJoin.of_counts(source, {m: n for (m, s), n in self.joins.items() if s == source})
            if join.judged < WARN_AFTER or join.ok or join.why is None:
                continue
            if now - self._warned.get(source, -float("inf")) < WARN_EVERY_S:
                continue
            self._warned[source] = now
            log.warning(
                "%d of %d steps made of %s spans are tied to no server request, so their KV story is unknown; "
                "most: %s (kvobs doctor says more)",
                join.judged - join.joined,
                join.judged,
                source,
                JOIN_WORDS[join.why],
            )

    def _write_sdk(self) -> int:
        """The kvobs SDK's steps and ended sessions that no recorder wrote: as its recorder would have, from the
        spans (the step's index, TTFT and token totals are on its span; the session ends with its span)."""
        steps, sessions, self._sdk_steps, self._sdk_sessions = self._sdk_steps, self._sdk_sessions, [], []
        self._seed({s.session_id or s.trace_id for s in steps + sessions})
        for span in sorted(steps, key=lambda s: s.start):
            session_id = span.session_id or span.trace_id
            state = self._sessions[session_id]
            index = span.step_index if span.step_index is not None else state.next_index
            failed = span.error_type is not None
            trace = self._traces.get(span.trace_id)
            tools = trace.tools(session_id, span.start, span.end, under=span.span_id) if trace is not None else []
            self.writer.add(
                _step_record(span, session_id, index, ttft_s=span.ttft_s, tools=json.dumps(tools) if tools else None)
            )
            state.next_index, state.num_failed = max(state.next_index, index + 1), state.num_failed + failed
            self.writer.upsert(
                SessionRecord(
                    session_id, source=span.convention, num_steps=state.next_index, num_failed_steps=state.num_failed
                )
            )
            if self.activity is not None:
                self.activity.claim(session_id, trace_id=span.trace_id)
            self.by_source[span.convention] += 1  # (kvobs_agent_steps_total counts the SDK's step spans already)
        for span in sessions:
            self.writer.upsert(
                SessionRecord(
                    span.session_id or span.trace_id,
                    agent_name=span.agent_name,
                    started_at=span.start,
                    ended_at=span.end,
                    source=SessionSource.SDK.value,
                    parent_session_id=span.parent_session_id or UNSET,
                )
            )
        return len(steps)

    def _seed(self, sessions: set[str]) -> None:
        new = [s for s in sessions if s not in self._sessions]
        known = self.step_counts(new) if new and self.step_counts is not None else {}
        for session_id in new:
            self._sessions[session_id] = _Session(*known.get(session_id, (0, 0)))

    def _write(self, trace: Trace, call: TraceSpan, chain: list[TraceSpan], session_id: str, found: Found) -> None:
        state = self._sessions[session_id]
        tools = trace.tools(session_id, state.last_end, call.start) if state.last_end is not None else []
        failed = call.error_type is not None
        answered = found.request_id if found.request_id in call.reply_ids else next(iter(call.reply_ids), None)
        self.writer.add(
            _step_record(
                call,
                session_id,
                state.next_index,
                response_id=answered,
                request_id=found.request_id,
                request_join=found.method.value,
                tools=json.dumps(tools) if tools else None,
            )
        )
        self.joins[found.method.value, call.convention] += 1
        if found.unfilled is not None:
            self._fill_cached(found.unfilled, call)
        state.next_index += 1
        state.num_failed += failed
        state.last_end = max(call.end, state.last_end or call.end)
        agents = [s for s in chain if s.role == AGENT and s.agent_name]
        if agents and state.agent_name is None:
            state.agent_name = agents[-1].agent_name  # the outermost
        self.writer.upsert(
            SessionRecord(
                session_id,
                source=call.convention,
                num_steps=state.next_index,
                num_failed_steps=state.num_failed,
                agent_name=state.agent_name or UNSET,  # (UNSET: an upsert keeps what the row has)
                started_at=call.start if state.next_index == 1 else UNSET,
            )
        )
        if self.activity is not None:
            self.activity.claim(session_id, trace_id=call.trace_id, request_id=found.request_id or answered)
        self.statuses[StepStatus.ERROR.value if failed else StepStatus.OK.value] += 1
        if call.error_type is not None:  # (failed)
            self.failures[call.error_type] += 1
        self.by_source[call.convention] += 1

    def _fill_cached(self, request: RequestRecord, call: TraceSpan) -> None:
        """A joined request whose own span said no cached tokens (vLLM's) takes the count its reply gave, as the
        call's span recorded it, where the two agree on the prompt's tokens; else it stays unknown, and why is
        counted."""
        cached = call.cached_tokens
        if cached is None:
            outcome = CachedFill.NO_COUNT
        elif call.prompt_tokens != request.prompt_tokens or cached > (call.prompt_tokens or 0):
            outcome = CachedFill.COUNTS_DIFFER
        else:
            outcome = CachedFill.FILLED
            self.writer.fill_cached(replace(request, cached_tokens=cached, cached_from=CachedFrom.REPLY.value))
            if self.activity is not None:
                self.activity.note_cached(request.request_id, cached)
        self.cached_fills[outcome.value] += 1


def _step_record(span: TraceSpan, session_id: str, index: int, **extra) -> StepRecord:
    """The `steps` row of a call's (or an SDK step's) span."""
    failed = span.error_type is not None
    return StepRecord(
        session_id=session_id,
        step_index=index,
        trace_id=span.trace_id,
        span_id=span.span_id,
        started_at=span.start,
        ended_at=span.end,
        error_type=span.error_type,
        status=(StepStatus.ERROR if failed else StepStatus.OK).value,
        e2e_s=span.end - span.start,
        prompt_tokens=span.prompt_tokens,
        cached_tokens=span.cached_tokens,
        completion_tokens=span.completion_tokens,
        **extra,
    )
