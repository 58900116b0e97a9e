"""One trace of an agent's spans as the step maker (`collectors.traces.span_steps`) keeps it: its spans by id, the LLM
calls waiting to be decided, and what a call's ancestors say (its session, its tools).

    trace.ancestors(call)                  # parent first, up to the root or the first span not received
    trace.rooted(call.span_id)             # every ancestor up to the root has arrived
    trace.session_of(call, chain)          # the session it belongs to (see `session_of`)
    trace.tools(session, since, until)     # the session's tool calls in that time, as `steps.tools` lists them
    trace.with_nested(call)                # the call with what the LLM spans inside it say (one call traced twice)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from collectors.traces.agent_spans import AGENT, LLM, TOOL, TraceSpan
from kvobs.semconv.spans import StepStatus

EPSILON_S = 1e-3  # clocks of one process: a tool that ends as the next call starts is inside the pause
MAX_DEPTH = 256  # ancestors followed at most (a malformed trace with a cycle ends there)


@dataclass
class Trace:
    spans: dict[str, TraceSpan] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)  # LLM call span id -> when it arrived
    last_seen: float = 0.0
    fallback: str | None = None  # set once a call of it was decided with no session named: then all its calls
    agents: list[TraceSpan] = field(default_factory=list)  # agent spans arrived since the last settle

    def ancestors(self, span: TraceSpan) -> list[TraceSpan]:
        found: list[TraceSpan] = []
        parent = span.parent_id
        while parent is not None and parent in self.spans and len(found) < MAX_DEPTH:
            found.append(self.spans[parent])
            parent = found[-1].parent_id
        return found

    def rooted(self, span_id: str) -> bool:
        span = self.spans[span_id]
        chain = self.ancestors(span)
        return (chain[-1] if chain else span).parent_id is None

    def session_of(self, span: TraceSpan, chain: list[TraceSpan], *, decide: bool = True) -> str:
        """The session named on the span, else on its nearest ancestor, else the trace id. Once a call of the trace
        was decided without a session named (its parent came after `settle_s`), every later call of the trace
        without one on itself takes the trace id too: a conversation is never split in two."""
        if span.session_id:
            return span.session_id
        named = next((s.session_id for s in chain if s.session_id), None)
        if named is not None and self.fallback is None:
            return named
        if decide:  # (a tool span is only compared, never decides)
            self.fallback = span.trace_id
        return span.trace_id

    def with_nested(self, call: TraceSpan) -> TraceSpan:
        """One LLM call traced twice, one span inside the other (LlamaIndex: its dispatcher's span holds the reply
        and its id, the callback's span inside it the token counts): the outer span with the ids and counts of the
        LLM spans inside it, where it has none of its own."""
        nested = [
            s
            for s in self.spans.values()
            if s.role == LLM and s is not call and call.span_id in {a.span_id for a in self.ancestors(s)}
        ]
        if not nested:
            return call
        ids = dict.fromkeys(call.reply_ids + tuple(i for s in nested for i in s.reply_ids))

        def first(field: str):
            own = getattr(call, field)
            return (
                own
                if own is not None
                else next((getattr(s, field) for s in nested if getattr(s, field) is not None), None)
            )

        counts = {f: first(f) for f in ("prompt_tokens", "cached_tokens", "completion_tokens")}
        return replace(call, reply_ids=tuple(ids), **counts)

    def tools(self, session_id: str, since: float, until: float, *, under: str | None = None) -> list[dict]:
        """The session's tool calls in this trace between its previous call's end and this call's start; `under`: only
        those inside that span (an SDK step's own tools, run within it). A tool span inside another with no agent or
        LLM call between them is the same call recorded twice (an instrumentation's span and the framework's own under
        it): counted once, as the outer."""
        tools = []
        for span in self.spans.values():
            if span.role != TOOL or span.start < since - EPSILON_S or span.end > until + EPSILON_S:
                continue
            chain = self.ancestors(span)
            if under is not None and under not in {s.span_id for s in chain}:
                continue
            if _inside_its_own_call(chain):
                continue
            if self.session_of(span, chain, decide=False) != session_id:
                continue
            status = (StepStatus.ERROR if span.error_type else StepStatus.OK).value
            tools.append(
                {
                    "name": span.tool_name,
                    "start": span.start,
                    "end": span.end,
                    "status": status,
                    "error_type": span.error_type,
                }
            )
        return sorted(tools, key=lambda t: t["start"])


def _inside_its_own_call(ancestors: list[TraceSpan]) -> bool:
    """Whether the nearest tool or agent or LLM span above a tool span is a tool span: the same call, wrapped."""
    for span in ancestors:  # nearest first
        if span.role in (AGENT, LLM):
            return False
        if span.role == TOOL:
            return True
    return False
