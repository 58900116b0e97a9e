"""How the steps made of agents' spans were tied to their server requests: the words for each outcome, what fixes
the missing ones, and the join rate of a set of steps.

    join_rates(steps)               # per session (or `by="source"` with the sessions): steps judged, joined, by method
    JOIN_WORDS["no_request"]         # what an outcome means, for a page, a log line and `kvobs doctor`
    JOIN_FIXES["no_request"]         # what brings the join (none for a refused call: it has no KV story)
    source_joins(store)              # `kvobs doctor`: per convention, joined of judged, and why the others were not

A step's `request_join` is written by the collector (`collectors/traces/request_join.py`); the SDK's steps have
none (their trace context reaches the server) and are not judged here: their rate is "not measured", never 0 or 100%.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from kvobs.semconv.spans import STEP_JOINED, StepJoin

JOIN_WORDS = {
    StepJoin.RESPONSE_ID.value: "joined by the id the server answered",
    StepJoin.TRACE.value: "joined by trace context (the call's traceparent reached the server)",
    StepJoin.TIMING.value: (
        "joined by timing: the only request in the call's time window with its prompt and completion token counts"
    ),
    StepJoin.UNANSWERED.value: "the call failed without an answer, and no request of its trace reached the store",
    StepJoin.NO_REQUEST.value: "no server request span arrived for the call's time window",
    StepJoin.ID_NOT_SEEN.value: "the reply names an id, and no request seen in the call's time window has it",
    StepJoin.AMBIGUOUS.value: "several requests fit the call's time window and token counts, so none is taken",
    StepJoin.NO_COUNTS.value: (
        "the call's span names no response id and no token counts, so the requests in its time window cannot be told "
        "apart"
    ),
}
_SPANS = (
    "export the server's request spans to the collector (vLLM: --otlp-traces-endpoint; kvobs serve: --otlp-endpoint)"
)
_CONTENT = (
    "keep the reply on the LLM span (OpenInference: do not hide outputs; OTel GenAI writes gen_ai.response.id), or "
    "send traceparent with the call (an HTTP client instrumentation), or the session header"
)
JOIN_FIXES = {
    StepJoin.NO_REQUEST.value: _SPANS,
    StepJoin.ID_NOT_SEEN.value: (
        "check that the collector receives the request spans of every replica the agent calls (" + _SPANS + ")"
    ),
    StepJoin.AMBIGUOUS.value: _CONTENT,
    StepJoin.NO_COUNTS.value: _CONTENT,
}


def join_rates(steps: pd.DataFrame, by: str = "session_id") -> pd.DataFrame:
    """Per `by` value: `judged` (steps with a `request_join`), `joined`, `by_timing`, `rate` (joined / judged; NaN
    where none was judged) and `why` (the most common reason among those not joined, None when all were)."""
    columns = ["judged", "joined", "by_timing", "rate", "why"]
    if steps.empty or "request_join" not in steps:
        return pd.DataFrame(columns=columns, index=pd.Index([], name=by))
    join = steps["request_join"]
    frame = pd.DataFrame(
        {
            by: steps[by],
            "judged": join.notna(),
            "joined": join.isin(STEP_JOINED),
            "by_timing": join.eq(StepJoin.TIMING.value),
        }
    )
    out = frame.groupby(by, sort=True)[["judged", "joined", "by_timing"]].sum().astype(int)
    out["rate"] = (out["joined"] / out["judged"]).where(out["judged"] > 0)
    missed = steps[join.notna() & ~join.isin(STEP_JOINED)]
    why = missed.groupby(by)["request_join"].agg(lambda s: s.value_counts().index[0]) if not missed.empty else None
    out["why"] = out.index.map(why.to_dict() if why is not None else {}).astype(object)
    out["why"] = out["why"].where(out["why"].notna(), None)
    return out[columns]


@dataclass(frozen=True)
class SourceJoin:
    """`kvobs doctor`'s check of one convention's steps: how many the collector judged, how many it joined."""

    source: str
    judged: int
    joined: int
    by_timing: int
    why: str | None  # the most common reason among those not joined

    @classmethod
    def of_counts(cls, source: str, counts: Mapping[str, int]) -> SourceJoin:
        """From the steps per `request_join` value (the collector's running totals)."""
        missed = {method: n for method, n in counts.items() if method not in STEP_JOINED}
        return cls(
            source,
            judged=sum(counts.values()),
            joined=sum(counts.values()) - sum(missed.values()),
            by_timing=counts.get(StepJoin.TIMING.value, 0),
            why=max(missed, key=missed.__getitem__) if missed else None,
        )

    @property
    def ok(self) -> bool:
        return 2 * self.joined >= self.judged  # most joined: the few that are not say why on their pages

    @property
    def words(self) -> str:
        said = f"{self.joined} of {self.judged} steps tied to their server request"
        if self.by_timing:
            said += f" ({self.by_timing} by timing)"
        if self.why is None:
            return said
        said += f"; most of the others: {JOIN_WORDS[self.why]}"
        return said + (f". Fix: {JOIN_FIXES[self.why]}" if not self.ok and self.why in JOIN_FIXES else "")


def source_joins(store, since: float | None = None, until: float | None = None) -> list[SourceJoin]:
    """Per convention (`sessions.source`) whose steps the collector judged in the range: its join rate."""
    steps = store.reads.steps(since, until)
    if steps.empty or "request_join" not in steps or steps["request_join"].isna().all():
        return []
    sessions = store.reads.sessions()
    source = dict(zip(sessions["session_id"], sessions["source"].fillna("unknown")))
    rates = join_rates(steps.assign(source=steps["session_id"].map(source).fillna("unknown")), by="source")
    return [
        SourceJoin(str(name), int(r.judged), int(r.joined), int(r.by_timing), r.why)
        for name, r in rates.iterrows()
        if r.judged > 0
    ]
