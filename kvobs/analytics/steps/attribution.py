"""Why did an agent step fail, and why did it get slow? Two questions, answered apart, both on the step's whole
latency (its start to its end), with the store's evidence.

    frame = attribute_steps(steps, requests, kv_events(store, kinds=ATTRIBUTION_KINDS), rates=PrefillRates(...))

A step's requests are those whose caller span is the step (`parent_span_id`), or, since the SDK's `chat` span sits
between them, those of the step's session (or trace) that arrived while the step ran. Its latency is split into
parts that add up to it (`kvobs.analytics.steps.latency_parts`: queue, preemption, prefill with the recompute the KV
record explains inside it, decode, its own tool calls, the time before its request reached the server, outside the
engine), and what the KV record shows about it (`causes`, the facts found, in this order;
`kvobs.analytics.steps.facts`):

- `invalidated`: the session's cached blocks were invalidated (or the whole cache cleared) between the session's
  previous request and the end of this step; evidence: the reasons.
- `prefix_evicted_in_pause`: blocks the session had cached were taken while it was idle, between its previous
  request's end and this step's first request (the tool pause); evidence: blocks and tokens lost.
- `routed_away_from_prefix`: its request recomputed a prefix that another replica of the fleet held at its lookup
  (`kvobs.analytics.cache.routing`, given as `routing`); evidence: the replica, its blocks, the tokens.
- `preempted`: a request of the step was preempted (recomputed); evidence: how often, what it cost.
- `queue_wait`: a request waited at least `queue_wait_s` before being scheduled, or was never scheduled.

`cause` is the fact that cost the most time over the session's typical step (`none` when none cost any).

Each part is weighed against its typical value (`kvobs.analytics.steps.typical`): the median of the session's other
successful steps; for a failed step, of its session's successful steps of its kind and size (none where there is
none: a timeout is then named by its largest part, never by its excess over other timeouts or over steps of another
size). The evidence says which. The recompute and the preemption are never typical: they count whole.

`slow_cause`: is the step slow against its session's typical step (its latency above `slow_factor` x the typical
latency, and at least `slow_min_s` above it)? Then the part whose excess over its typical value is largest
(`latency_parts.EXCESS_CAUSES`), with its share in the evidence; else `none`.

`failure_cause` (failed steps only): the error itself for model, output, tool or request errors (`invalid_response`,
an HTTP status, a connection error): the cache does not make a model answer badly. A timeout's cause is the part
that cost it: the largest excess over its typical value, else, where every part was as usual, the part that held
the most of its time. A timeout with no request in the store is `never_reached_server` where the servers show they
would have recorded it (`kvobs.analytics.steps.unreached`), else `timeout` (not split: the store cannot tell).
`failure_kind` groups them: `cache` (a lost, invalidated or routed prefix, a preemption), `queue`, `engine` (its
prefill or decode), `tool` (its own tool calls), `outside` (before the server or outside the engine), `timeout` (not
split), `model` (`invalid_response`), `request` (anything else).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from functools import cached_property

import numpy as np
import pandas as pd

from kvobs.analytics.cache import PrefillRates
from kvobs.analytics.steps.excess import (
    EXCESS_CAUSES,
    FAILURE_KIND_OF,
    excess_words,
    explain_excess,
    largest_part,
    part_seconds,
)
from kvobs.analytics.steps.facts import (
    Events,
    KVRecord,
    facts_frame,
    missing,
    plain_parts,
    positions_by_value,
    step_facts,
)
from kvobs.analytics.steps.latency_parts import ESTIMATES, PARTS
from kvobs.analytics.steps.typical import NO_SUCCESS, typical_steps
from kvobs.analytics.steps.unreached import NOT_KNOWN, ServerRecord
from kvobs.semconv.spans import KVEventKind, StepErrorType, StepStatus

ATTRIBUTION_KINDS = tuple(
    k.value
    for k in (
        KVEventKind.EVICTED,
        KVEventKind.REMOVED,
        KVEventKind.INVALIDATED,
        KVEventKind.CLEARED,
        KVEventKind.PREEMPTED,
        KVEventKind.HIT,  # a preempted request's re-admission (reason `readmission`)
        KVEventKind.TIER_LOADED,  # blocks an offload tier gave back (a pause loss it saved)
    )
)
CAUSES = ("invalidated", "prefix_evicted_in_pause", "routed_away_from_prefix", "preempted", "queue_wait", "none")
SLOW_CAUSES = (*dict.fromkeys(cause for cause, _ in EXCESS_CAUSES.values()), "none")
FAILURE_KINDS = ("cache", "queue", "engine", "tool", "outside", "timeout", "model", "request")
MODEL_ERRORS = frozenset({StepErrorType.INVALID_RESPONSE.value})  # the model answered, but not as the agent needs
SLOW_FACTOR, SLOW_MIN_S = 1.5, 0.1  # slow: over this many times its typical latency, and at least this much over
# each fact's candidate of the excess (`latency_parts.explain_excess`)
_FACT_PART = {cause: part for part, (cause, _) in EXCESS_CAUSES.items() if cause in CAUSES}
# weighed as usual
TYPICAL = ("latency_s", "queue_s", "prefill_s", "decode_s", "tool_s", "before_s", "other_s", "tpot_s")
# aligned: the column names read better filled than one per line
# fmt: off
COLUMNS = [
    "session_id", "step_index", "status", "error_type", "started_at", "e2e_s", "ttft_s", "trace_id", "span_id",
    "response_id", "request_join", "instance", "cause", "causes", "evidence", "blocks_lost_in_pause",
    "tokens_lost_in_pause",
    "routed_tokens", "routed_from", "preemptions", "preemption", "invalidation_reasons", "max_queue_s",
    "never_scheduled", "num_requests", "cached_tokens", "slow", "typical_s", "slow_cause", "failure_cause",
    "failure_kind", "latency_s", "excess_s", *PARTS, *ESTIMATES, "new_prefill_s", "decoded_tokens",
    *(f"typical_{p}" for p in TYPICAL[1:]), "prefill_rate", *(f"{part}_excess_s" for part in EXCESS_CAUSES),
    "dominant", "dominant_share",
]
# fmt: on


class _Requests:
    """Requests indexed for per-step lookup: by caller span, and by session and trace in arrival order."""

    def __init__(self, requests: pd.DataFrame) -> None:
        frame = self.frame = requests.sort_values("arrival_ts", kind="stable").reset_index(drop=True)
        self.arrival = frame["arrival_ts"].to_numpy(float)
        self.first_token = frame["first_token_ts"].to_numpy(float)
        self.finished = frame["finished_ts"].to_numpy(float)
        self.queue = frame["queue_s"].to_numpy(float)
        self.preemptions = frame["num_preemptions"].fillna(0).to_numpy(float)
        self.prompt = frame["prompt_tokens"].to_numpy(float)
        self.cached = frame["cached_tokens"].to_numpy(float)
        self.completion = frame["completion_tokens"].to_numpy(float)
        self.request_id = frame["request_id"].to_numpy(object)
        self.instance = frame["instance"].to_numpy(object)
        self.by_span = positions_by_value(frame["parent_span_id"].to_numpy(object))
        self.by_request = positions_by_value(self.request_id)
        self.by_session = positions_by_value(frame["session_id"].to_numpy(object))
        self.by_trace = positions_by_value(frame["trace_id"].to_numpy(object))
        # each group's arrivals (ascending, as the positions are), to cut a step's time out by bisection
        self._arrivals = {id(p): self.arrival[p] for group in (self.by_session, self.by_trace) for p in group.values()}

    @cached_property
    def servers(self) -> ServerRecord:
        """What the read shows of each server, built the first time a step with no request asks it."""
        reasons = self.frame["finish_reason"].to_numpy(object) if "finish_reason" in self.frame else None
        return ServerRecord.of(self.instance, self.arrival, self.finished, reasons)

    def of_step(self, step) -> np.ndarray:
        """Positions of the requests a step sent: the request the collector joined it to (a step made of an
        agent's spans; older rows: the reply's id), by caller span, else by session or trace within the step's time.
        A step the collector judged and joined to none sent none that is known."""
        joined = getattr(step, "request_id", None)
        if isinstance(joined, str):
            return self.by_request.get(joined, _NONE)
        if isinstance(getattr(step, "request_join", None), str):
            return _NONE  # judged when its spans arrived: no request of it was seen (never a guess at read time)
        response_id = getattr(step, "response_id", None)
        direct = self.by_request.get(response_id) if isinstance(response_id, str) else None
        if direct is None:
            direct = self.by_span.get(step.span_id)
        if direct is not None:
            return direct
        ended = step.ended_at if not missing(step.ended_at) else np.inf
        found = [
            self._within(group.get(key), step.started_at, ended)
            for group, key in ((self.by_session, step.session_id), (self.by_trace, step.trace_id))
        ]
        if not len(found[1]) or np.array_equal(found[0], found[1]):
            return found[0]
        if not len(found[0]):
            return found[1]
        return np.asarray(sorted(set(found[0].tolist()) | set(found[1].tolist())), dtype=np.int64)

    def _within(self, positions, start: float, end: float) -> np.ndarray:
        if positions is None:
            return _NONE
        arrivals = self._arrivals[id(positions)]
        return positions[np.searchsorted(arrivals, start, "left") : np.searchsorted(arrivals, end, "right")]


_NONE = np.empty(0, dtype=np.int64)


def attribute_steps(
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    events: pd.DataFrame,
    *,
    rates: PrefillRates | None = None,
    queue_wait_s: float = 1.0,
    slow_factor: float = SLOW_FACTOR,
    slow_min_s: float = SLOW_MIN_S,
    failed_only: bool = False,
    error_types: Collection[str] | None = None,
    routing: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per step (columns `COLUMNS`); `events` are KV events of `ATTRIBUTION_KINDS`; `rates`: the instances'
    measured prefill rates (default: from `requests`), only to estimate a preemption a server does not time;
    `routing`: `routing.routing_losses` of the requests (a fleet), none by default. `failed_only`: rows of failed
    steps only (of `error_types`, when given), the others read just for what a failed step needs (their parts, for
    its session's typical step, and the end of the step before it), which spares the KV analysis of every other
    step."""
    steps = steps.assign(wanted=attributed_mask(steps, error_types))
    if "tools" not in steps:
        steps = steps.assign(tools=None)
    reqs = _Requests(requests)
    rates = PrefillRates(requests) if rates is None else rates
    empty = Events(events.iloc[0:0])
    by_session = Events.by_session(events) if not events.empty else {}
    kv = KVRecord.from_events(events, routing)
    in_order = steps.sort_values(["session_id", "step_index"], kind="stable").reset_index(drop=True)
    in_order = in_order.astype({c: object for c in in_order.columns if pd.api.types.is_string_dtype(in_order[c])})
    parts, rows = [], []  # parts of every step (its session's typical step needs them); rows of the attributed
    sizes, kinds = [], []  # each step's largest prompt and its number of requests: a failed step's kind and size
    for session_id, session_steps in itertools.groupby(
        in_order.itertuples(index=False), key=lambda step: step.session_id
    ):  # (from numpy objects: iterating Arrow strings costs a call a value)
        session_events = by_session.get(session_id, empty)
        previous_end = None
        for step in session_steps:
            sent = reqs.of_step(step)
            sizes.append(_size(step, reqs, sent))
            kinds.append(len(sent))
            if not failed_only or step.wanted:
                row = step_facts(step, reqs, sent, previous_end, session_events, kv, rates, queue_wait_s)
                rows.append(row)
                parts.append(row.parts.as_dict())
            else:
                parts.append(plain_parts(step, reqs, sent, kv, rates).as_dict())
            ends = [end for end in reqs.finished[sent].tolist() if end == end]
            previous_end = max(ends) if ends else (step.ended_at if not missing(step.ended_at) else None)
    floats = {
        "max_queue_s": float,
        "cached_tokens": float,
        "prefill_rate": float,
        "routed_tokens": float,
        "instance": object,  # text, None where a step sent no request: one dtype whichever steps are in the frame
        "routed_from": object,
        "preemption": object,
        **dict.fromkeys(ESTIMATES, float),
    }
    frame = facts_frame(rows).astype(floats) if rows else pd.DataFrame()
    for column in ("instance", "routed_from", "preemption"):  # None, not NaN, for a missing one, as in text columns
        if column in frame:
            frame[column] = frame[column].where(frame[column].notna(), None)
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    keep = in_order["wanted"].to_numpy(bool) if failed_only else np.ones(len(in_order), bool)
    measured = pd.DataFrame(parts, index=in_order.index)
    with np.errstate(divide="ignore", invalid="ignore"):
        tokens = measured["decoded_tokens"].to_numpy(float)
        measured["tpot_s"] = np.where(tokens > 0, measured["decode_s"].to_numpy(float) / tokens, np.nan)
    sessions = in_order["session_id"].to_numpy(object)
    ok = (in_order["status"] == StepStatus.OK.value).to_numpy(bool)
    found = typical_steps(
        sessions, ok, {c: measured[c].to_numpy(float) for c in TYPICAL}, np.asarray(sizes, float), np.asarray(kinds)
    )
    typical = {c: v[keep] for c, v in found.values.items()}
    for column in (*ESTIMATES, "preempted_s"):  # a recompute or a preemption is never usual: it counts whole
        typical[column] = np.zeros(len(frame))
    typical["new_prefill_s"] = typical["prefill_s"]
    frame["typical_from"], frame["no_typical"] = found.taken_from[keep], found.none_because[keep]
    return _verdicts(frame, typical, slow_factor, slow_min_s)


def _size(step, reqs, sent) -> float:
    """A step's size: its largest request's prompt tokens, else its reply's (NaN: not known)."""
    prompts = reqs.prompt[sent]
    if len(prompts) and not np.isnan(prompts).all():
        return float(np.nanmax(prompts))
    own = getattr(step, "prompt_tokens", None)
    return float(own) if own is not None and not missing(own) else np.nan


def attributed_mask(steps: pd.DataFrame, error_types: Collection[str] | None = None) -> pd.Series:
    """The steps `failed_only` attributes: failed ones, of `error_types` when given."""
    failed = steps["status"] == StepStatus.ERROR.value
    return failed & steps["error_type"].isin(list(error_types)) if error_types is not None else failed


def _verdicts(frame: pd.DataFrame, typical: dict, slow_factor: float, slow_min_s: float) -> pd.DataFrame:
    """The slow and failure verdicts from each row's parts and their typical values (`typical.typical_steps` over
    every step of its session, attributed or not)."""
    frame = explain_excess(frame, typical)
    # no request in the store and no telling why: its time is not split, so no part of it is the cause
    unsplit = (frame["num_requests"].to_numpy(int) == 0) & frame["unreached"].isna().to_numpy(bool)
    frame.loc[unsplit, "dominant"] = None
    frame.loc[unsplit, ["dominant_s", "dominant_share"]] = np.nan
    latency, typical_s = frame["latency_s"].to_numpy(float), typical["latency_s"]
    frame["typical_s"] = typical_s
    for part in TYPICAL[1:]:
        frame[f"typical_{part}"] = typical[part]
    frame["slow"] = (latency > typical_s * slow_factor) & (latency - typical_s >= slow_min_s)
    dominant = frame["dominant"].to_numpy(object)
    slow = frame["slow"].to_numpy(bool)
    _queue_as_fact(frame, typical["queue_s"], slow_min_s)
    frame["slow_cause"] = [EXCESS_CAUSES[d][0] if s and d is not None else "none" for s, d in zip(slow, dominant)]
    frame["cause"] = [
        _costliest(row)
        for row in frame[["causes", *(f"{p}_excess_s" for p in _FACT_PART.values())]].itertuples(index=False)
    ]
    records = frame.to_dict("records")
    evidence = []
    failure_cause, failure_kind = np.full(len(frame), None, dtype=object), np.full(len(frame), None, dtype=object)
    for i, (row, t, s) in enumerate(zip(records, typical_s, slow)):
        words = [excess_words(row, t)] if s and row["dominant"] is not None else []
        if row["status"] == StepStatus.ERROR.value:
            failure_cause[i], failure_kind[i], said = failure_verdict(row["error_type"], row)
            if said and failure_cause[i] in (EXCESS_CAUSES[row["dominant"] or "other"][0], "never_reached_server"):
                words = []  # the timeout's words already say what its slowness would
            words = [said, *words] if said else words
        evidence.append("; ".join(words + list(row["facts"])))
    frame["evidence"] = evidence
    frame["failure_cause"], frame["failure_kind"] = failure_cause, failure_kind
    return frame[COLUMNS]


def _queue_as_fact(frame: pd.DataFrame, typical_queue: np.ndarray, slow_min_s: float) -> None:
    """A queue wait shorter than `queue_wait_s` is a fact too when it cost at least `slow_min_s` over the session's
    typical queue: a 0.75 s wait is what made a 0.16 s step take 1 s."""
    extra = (frame["queue_excess_s"].to_numpy(float) >= slow_min_s) & ~np.isnan(typical_queue)  # (none: no fact)
    for i in np.flatnonzero(extra & ~frame["causes"].str.contains("queue_wait").to_numpy(bool)):
        causes = frame.at[i, "causes"]
        frame.at[i, "causes"] = "queue_wait" if causes == "none" else f"{causes},queue_wait"
        frame.at[i, "facts"] = [
            *frame.at[i, "facts"],
            f"waited {frame.at[i, 'queue_s']:.2f} s in the queue (typically {typical_queue[i]:.2f} s)",
        ]


def _costliest(row) -> str:
    """Of the facts found, the one whose part of the excess is largest and positive (unknown costs count as
    possible, after known ones); `none` when no fact cost the step any time over its typical step."""
    found = [c for c in row[0].split(",") if c in _FACT_PART]
    costs = dict(zip(_FACT_PART.values(), row[1:]))
    known = [(costs[_FACT_PART[c]], c) for c in found if costs[_FACT_PART[c]] == costs[_FACT_PART[c]]]
    positive = [(cost, c) for cost, c in known if cost > 0]
    if positive:
        return max(positive, key=lambda item: (item[0], -found.index(item[1])))[1]
    unknown = [c for c in found if costs[_FACT_PART[c]] != costs[_FACT_PART[c]]]
    return unknown[0] if unknown else "none"


def failure_verdict(error_type, row=None) -> tuple[str, str, str]:
    """A failed step's cause, kind and words. Only a timeout is weighed by its parts (`row`, its attribution): the
    part that cost it; any other error is its own cause."""
    error = "unknown" if missing(error_type) else str(error_type)
    if error != StepErrorType.TIMEOUT.value:
        return error, "model" if error in MODEL_ERRORS else "request", ""
    if row is None or not row.get("num_requests"):
        unreached = None if row is None else row.get("unreached")
        if isinstance(unreached, str):
            return "never_reached_server", FAILURE_KIND_OF["never_reached_server"], f"timed out: {unreached}"
        return error, "timeout", f"timed out; {NOT_KNOWN}"
    baseline = None if missing(row.get("typical_from")) else row["typical_from"]  # (NaN once through a frame)
    candidate = (row["dominant"] if baseline is not None else None) or largest_part(row)
    if candidate is None:
        return error, "timeout", f"timed out after {row['latency_s']:.2f} s; none of its time was measured"
    cause, words = EXCESS_CAUSES[candidate]
    seconds = part_seconds(row, candidate)
    said = f"timed out after {row['latency_s']:.2f} s: {words}, {seconds:.2f} s of it"
    if baseline is None:
        said += f" (its largest part: {row.get('no_typical') or NO_SUCCESS})"
    elif row["dominant"] is not None:
        said += f" ({row['dominant_s']:.2f} s more than usual, against {baseline})"
    else:
        said += f" (its largest part: every part as usual, against {baseline})"
    if candidate == "before":
        said += reached_words(row["reached_after_s"], row["latency_s"])
    return cause, FAILURE_KIND_OF[cause], said


def reached_words(reached_after_s: float, latency_s: float) -> str:
    """When a step's first request reached the server, said beside the time before it."""
    if reached_after_s != reached_after_s:
        return ""
    if reached_after_s >= latency_s:
        return f"; its request reached the server only {reached_after_s - latency_s:.2f} s after the step ended"
    return f"; its request reached the server {reached_after_s:.2f} s into the step"


def step_requests(requests: pd.DataFrame, steps: pd.DataFrame) -> list[pd.DataFrame]:
    """For each row of `steps`, in order, the requests it sent (the attribution's own matching), by arrival."""
    index = _Requests(requests)
    return [index.frame.iloc[index.of_step(step)] for step in steps.itertuples(index=False)]


def failure_summary(attributed: pd.DataFrame) -> pd.DataFrame:
    """Failed steps per failure cause: `failure_kind`, `failure_cause`, `failed_steps`, `share` (of failed steps),
    most first; model errors stay model errors, only timeouts carry a KV or queue cause."""
    failed = attributed[attributed["status"] == StepStatus.ERROR.value]
    columns = ["failure_kind", "failure_cause", "failed_steps", "share"]
    if failed.empty:
        return pd.DataFrame(columns=columns)
    out = failed.groupby(["failure_kind", "failure_cause"]).size().rename("failed_steps").reset_index()
    out["share"] = out["failed_steps"] / len(failed)
    return out.sort_values(["failed_steps", "failure_cause"], ascending=[False, True]).reset_index(drop=True)[columns]


def failure_split(attributed: pd.DataFrame) -> dict[str, int]:
    """Failed steps by kind (`FAILURE_KINDS`): how many the cache or queue explains, how many are model errors."""
    failed = attributed[attributed["status"] == StepStatus.ERROR.value]
    counts = failed["failure_kind"].value_counts()
    return {kind: int(counts.get(kind, 0)) for kind in FAILURE_KINDS}
