"""What the record shows about one agent step: its latency in parts (`kvobs.analytics.steps.latency_parts`) and the
facts about its cache, each with what it cost (`causes`, `facts`: the evidence), for
`kvobs.analytics.steps.attribution`.

The facts, each looked up in the step's session's KV events and its requests:
- `invalidated`: its cached blocks invalidated (or the whole cache reset) between its previous request and its end;
- `prefix_evicted_in_pause`: blocks it had cached taken while it was idle, between its previous request's end and
  this step's first request (the tool pause); blocks the agent released itself are no loss, and blocks its requests
  loaded back from an offload tier (`tier_loaded`) were saved, not lost (said as a fact of their own);
- `routed_away_from_prefix`: its request recomputed a prefix another replica of the fleet held at its lookup
  (`kvobs.analytics.cache.routing`: the replica, its blocks, the tokens);
- `preempted`: a request of the step preempted (recomputed), with what it cost (measured from the engine's
  preemption and re-admission rows, else estimated, else said to be unknown);
- `queue_wait`: a request waited at least `queue_wait_s` before being scheduled, or was never scheduled.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field, fields, replace

import numpy as np
import pandas as pd

from kvobs.analytics.cache import PrefillRates
from kvobs.analytics.steps.evidence import RecomputeWords, load_words, preemption_words, prefill_rate_at
from kvobs.analytics.steps.latency_parts import (
    ESTIMATES,
    PARTS,
    RequestTimes,
    StepParts,
    step_parts,
)
from kvobs.semconv.reasons import READMISSION, RELEASE_REASONS
from kvobs.semconv.spans import KVEventKind

EVICTION_KINDS = (KVEventKind.EVICTED.value, KVEventKind.REMOVED.value)


def positions_by_value(values: np.ndarray) -> dict:
    """Value -> the positions holding it, ascending (missing values left out): one factorize and one stable sort, not
    a groupby (a per-value lookup of an Arrow string, and a DataFrame per group, each cost more than the whole)."""
    codes, found = pd.factorize(values)
    order = np.argsort(codes, kind="stable").astype(np.int64)  # rows of no value (code -1) first, then left out
    bounds = np.searchsorted(codes[order], np.arange(len(found) + 1))
    return {value: order[bounds[i] : bounds[i + 1]] for i, value in enumerate(found.tolist())}


class Events:
    """One session's KV events (or the instance-wide resets) in time order, sliced by (after, until] windows."""

    COLUMNS = ("ts", "kind", "block_hash", "num_tokens", "reason")

    def __init__(self, events: pd.DataFrame) -> None:
        self._take(events.sort_values("ts", kind="stable"))

    def _take(self, frame: pd.DataFrame) -> None:
        """The columns of `frame`, already in time order."""
        self.ts = frame["ts"].to_numpy(float)
        self.kind = frame["kind"].to_numpy(object)
        self.block_hash = frame["block_hash"].to_numpy(object)
        self.num_tokens = frame["num_tokens"].to_numpy(float)
        self.reason = frame["reason"].to_numpy(object)

    @classmethod
    def by_session(cls, events: pd.DataFrame) -> dict:
        """Session id -> that session's `Events`: one sort of every row by time, and a slice of each column per
        session (`positions_by_value`)."""
        ordered = events.sort_values("ts", kind="stable")
        whole = cls.__new__(cls)
        whole._take(ordered)
        return {
            session_id: whole._rows(rows)
            for session_id, rows in positions_by_value(ordered["session_id"].to_numpy(object)).items()
        }

    def _rows(self, rows: np.ndarray) -> Events:
        """These positions' events, in the same order."""
        part = Events.__new__(Events)
        for column in self.COLUMNS:
            setattr(part, column, getattr(self, column)[rows])
        return part

    def window(self, after: float, until: float) -> slice:
        return slice(*np.searchsorted(self.ts, [after, until], side="right"))


@dataclass
class KVRecord:
    """What every step's facts look up by request or instance: the resets, each request's preemptions (ts, computed
    tokens lost) and re-admissions (ts), and its routing loss (a fleet)."""

    resets: Events
    preempted: dict = field(default_factory=lambda: defaultdict(list))
    readmitted: dict = field(default_factory=lambda: defaultdict(list))
    routed: dict = field(default_factory=dict)  # request id -> its `routing.routing_losses` row

    @classmethod
    def from_events(cls, events: pd.DataFrame, routing: pd.DataFrame | None = None) -> KVRecord:
        empty = Events(events.iloc[0:0])
        record = cls(Events(events[events["kind"] == KVEventKind.CLEARED.value]) if not events.empty else empty)
        if not events.empty:
            ordered = events.sort_values("ts", kind="stable")
            rows = ordered[ordered["kind"] == KVEventKind.PREEMPTED.value]
            for rid, ts, tokens in zip(rows["request_id"], rows["ts"], rows["num_tokens"].astype(float)):
                record.preempted[rid].append((float(ts), 0.0 if tokens != tokens else float(tokens)))
            hits = ordered[(ordered["kind"] == KVEventKind.HIT.value) & (ordered["reason"] == READMISSION)]
            for rid, ts in zip(hits["request_id"], hits["ts"]):
                record.readmitted[rid].append(float(ts))
        if routing is not None and not routing.empty:
            record.routed = {row["request_id"]: row for row in routing[routing["routed_blocks"] > 0].to_dict("records")}
        return record


def missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def step_window(step, reqs, sent) -> tuple[float, float]:
    """(start, end) of a step: its recorded start and end-to-end time (else its end, else its requests' end)."""
    start = float(step.started_at)
    if not missing(step.e2e_s):
        return start, start + float(step.e2e_s)
    if not missing(step.ended_at):
        return start, float(step.ended_at)
    ends = reqs.finished[sent]
    return start, float(np.nanmax(ends)) if len(ends) and not np.isnan(ends).all() else np.nan


def request_times(reqs, sent, kv: KVRecord | None) -> list[RequestTimes]:
    """The step's requests (`sent`: positions in the attribution's `_Requests`) with the engine's preemption record."""
    out = []
    for i in sent:
        rid = reqs.request_id[i]
        out.append(
            RequestTimes(
                rid,
                reqs.arrival[i],
                reqs.queue[i],
                reqs.first_token[i],
                reqs.finished[i],
                reqs.prompt[i],
                reqs.cached[i],
                reqs.completion[i],
                int(reqs.preemptions[i]),
                kv.preempted.get(rid, []) if kv is not None else [],
                kv.readmitted.get(rid, []) if kv is not None else [],
            )
        )
    return out


def tool_intervals(step) -> list[tuple[float, float]]:
    """The step's recorded tool calls as (start, end); `step_parts` keeps those inside the step."""
    tools = getattr(step, "tools", None)
    if not isinstance(tools, str) or not tools:
        return []
    return [(float(t["start"]), float(t["end"])) for t in json.loads(tools)]


def plain_parts(step, reqs, sent, kv: KVRecord | None, rates: PrefillRates | None) -> StepParts:
    """A step's parts without its KV facts (what a step that is only another's typical needs)."""
    start, end = step_window(step, reqs, sent)
    times = request_times(reqs, sent, kv)
    rate = prefill_rate_at(rates, reqs, sent)
    return step_parts(start, end, times, tools=tool_intervals(step), rate=rate)


def step_facts(
    step,
    reqs,
    sent,
    previous_end,
    session_events: Events,
    kv: KVRecord,
    rates: PrefillRates | None,
    queue_wait_s: float,
) -> StepFacts:
    """One attributed step: its parts (`latency_parts.StepParts`), its facts (`causes`, `facts`: the evidence,
    each with what it cost). `sent`: its requests' positions in `reqs` (the attribution's `_Requests`);
    `previous_end`: when the session's previous step's requests ended (None for its first step)."""
    start, end = step_window(step, reqs, sent)
    first_arrival = reqs.arrival[sent].min() if len(sent) else start
    lost = (
        _Losses.between(session_events, kv, previous_end, end if end == end else first_arrival, first_arrival)
        if previous_end is not None
        else _Losses()
    )
    loss = _routing_loss(reqs, sent, kv.routed)
    routed_tokens = {rid: row["routed_tokens"] for rid in reqs.request_id[sent] if (row := kv.routed.get(rid))}
    times = request_times(reqs, sent, kv)
    parts = step_parts(
        start,
        end,
        times,
        tools=tool_intervals(step),
        lost_tokens=lost.lost_tokens,
        invalidated_tokens=lost.invalidated_tokens,
        routed_tokens=routed_tokens,
        rate=prefill_rate_at(rates, reqs, sent),
    )
    recompute = RecomputeWords(parts, times)
    causes, facts = lost.said(recompute, parts, first_arrival - (previous_end or 0.0))
    if lost.saved_blocks:
        facts[-1] += load_words(rates, reqs, sent, lost.saved_tokens)
    if loss is not None:
        causes.append("routed_away_from_prefix")
        facts.append(
            f"routed to {loss['instance']}, which had {loss['own_blocks']} of its prefix's blocks cached, while "
            f"{loss['best_instance']} held {loss['best_blocks']}: {loss['routed_tokens']} tokens recomputed that "
            f"{loss['best_instance']} had cached" + recompute.words(parts.routed_recompute_s, loss["routed_tokens"])
        )
    preemptions = max(int(reqs.preemptions[sent].sum()), sum(len(t.preempted) for t in times))
    if preemptions:
        causes.append("preempted")
        facts.append(preemption_words(preemptions, parts, times, start, end))
    max_queue = _queue_wait(reqs, sent, parts, queue_wait_s, causes, facts)

    measured = sent[parts.prefill_request] if parts.prefill_request >= 0 else (sent[0] if len(sent) else None)
    unreached = None if len(sent) else reqs.servers.unreached_words(_servers_of(step, reqs), end - start, end)
    if unreached is not None:  # what no request's times split: the time before the server, which it never reached
        parts = replace(parts, before_s=parts.other_s, other_s=0.0)
    return StepFacts(
        session_id=step.session_id,
        step_index=step.step_index,
        status=step.status,
        error_type=step.error_type,
        started_at=step.started_at,
        e2e_s=step.e2e_s,
        ttft_s=step.ttft_s,
        trace_id=step.trace_id,
        span_id=step.span_id,
        response_id=getattr(step, "response_id", None),
        request_join=getattr(step, "request_join", None),
        causes=",".join(causes) or "none",
        facts=facts,
        blocks_lost_in_pause=lost.lost_blocks,
        tokens_lost_in_pause=lost.lost_tokens,
        instance=reqs.instance[measured] if measured is not None else None,
        routed_tokens=0 if loss is None else loss["routed_tokens"],
        routed_from=None if loss is None else loss["best_instance"],
        preemptions=preemptions,
        invalidation_reasons=",".join(lost.reasons),
        max_queue_s=max_queue,
        num_requests=len(sent),
        cached_tokens=float(np.nansum(reqs.cached[sent])) if (~np.isnan(reqs.cached[sent])).any() else None,
        unreached=unreached,
        parts=parts,
    )


@dataclass(frozen=True)
class _Losses:
    """What the session's KV events show a step lost since its previous step's requests ended: blocks invalidated
    (or a reset) up to the step's end, and blocks taken from the cache in the pause before its first request, those
    its requests loaded back from an offload tier apart (saved, not lost)."""

    reasons: list[str] = field(default_factory=list)
    invalidated_blocks: int = 0
    invalidated_tokens: int = 0
    lost_blocks: int = 0
    lost_tokens: int = 0
    saved_blocks: int = 0
    saved_tokens: int = 0

    @classmethod
    def between(cls, events: Events, kv: KVRecord, previous_end: float, fact_end: float, first_arrival: float):
        window = events.window(previous_end, fact_end)
        invalidated = events.kind[window] == KVEventKind.INVALIDATED.value
        reset_reasons = kv.resets.reason[kv.resets.window(previous_end, fact_end)]
        reasons = sorted(
            {r for r in events.reason[window][invalidated] if not missing(r)}
            | {str(r) for r in reset_reasons if not missing(r)}
        )
        invalidated_blocks = invalidated_tokens = 0
        if invalidated.any() or len(reset_reasons):
            invalidated_blocks, invalidated_tokens = _distinct(
                events.block_hash[window][invalidated], events.num_tokens[window][invalidated]
            )
        pause = events.window(previous_end, first_arrival)
        taken = np.isin(events.kind[pause], EVICTION_KINDS) & ~np.isin(
            events.reason[pause].astype(object), list(RELEASE_REASONS)
        )
        # taken from the cache, but found in an offload tier by this step's requests: loaded back, not recomputed
        loaded = set(events.block_hash[window][events.kind[window] == KVEventKind.TIER_LOADED.value])
        saved = taken & np.fromiter((h in loaded for h in events.block_hash[pause]), bool, taken.size)
        saved_blocks, saved_tokens = _distinct(events.block_hash[pause][saved], events.num_tokens[pause][saved])
        lost_blocks, lost_tokens = _distinct(
            events.block_hash[pause][taken & ~saved], events.num_tokens[pause][taken & ~saved]
        )
        return cls(
            reasons, invalidated_blocks, invalidated_tokens, lost_blocks, lost_tokens, saved_blocks, saved_tokens
        )

    def said(self, recompute: RecomputeWords, parts: StepParts, pause_s: float) -> tuple[list[str], list[str]]:
        """(causes, facts) of the losses, in the order a step's facts are told; a tier's saved blocks are evidence
        with no cause (the copy back is part of the step's prefill, not a recompute), told last."""
        causes, facts = [], []
        if self.invalidated_blocks or self.reasons:
            causes.append("invalidated")
            facts.append(
                f"cache invalidated ({', '.join(self.reasons) or 'reset'}): {self.invalidated_blocks} of its blocks"
                + recompute.words(parts.invalidated_recompute_s, self.invalidated_tokens)
            )
        if self.lost_blocks:
            causes.append("prefix_evicted_in_pause")
            facts.append(
                f"{self.lost_blocks} cached blocks ({self.lost_tokens} tokens) evicted during the {pause_s:.2f} s "
                "pause before it" + recompute.words(parts.lost_recompute_s, self.lost_tokens)
            )
        if self.saved_blocks:
            facts.append(
                f"{self.saved_blocks} of its cached blocks ({self.saved_tokens} tokens) evicted from the cache during "
                f"the {pause_s:.2f} s pause before it were loaded back from the offload tier, not recomputed"
            )
        return causes, facts


def _queue_wait(reqs, sent, parts: StepParts, queue_wait_s: float, causes: list, facts: list) -> float | None:
    """The step's longest queue wait (None where no request says), with its cause and fact where it was at least
    `queue_wait_s`, or its request was never scheduled."""
    queue = reqs.queue[sent]
    queue = queue[~np.isnan(queue)]
    max_queue = float(queue.max()) if len(queue) else None
    if parts.never_scheduled:
        causes.append("queue_wait")
        facts.append(f"waited {parts.queue_s:.2f} s in the queue and was never scheduled")
    elif max_queue is not None and max_queue >= queue_wait_s:
        causes.append("queue_wait")
        facts.append(f"waited {max_queue:.2f} s in the queue")
    return max_queue


def _servers_of(step, reqs) -> list[str]:
    """The servers a step's request could have gone to: its session's other requests', else its trace's (none:
    every server in the read, `ServerRecord.unreached_words`)."""
    for group, key in ((reqs.by_session, step.session_id), (reqs.by_trace, step.trace_id)):
        positions = group.get(key) if not missing(key) else None
        if positions is not None and len(positions):
            return [str(i) for i in set(reqs.instance[positions].tolist())]
    return []


@dataclass(frozen=True, slots=True)
class StepFacts:
    """One attributed step (`facts`): the step, what the KV record shows of it (`causes`, `facts`: the
    evidence, each with what it cost) and its latency's parts."""

    session_id: str
    step_index: int
    status: str
    error_type: str | None
    started_at: float
    e2e_s: float | None
    ttft_s: float | None
    trace_id: str | None
    span_id: str | None
    response_id: str | None
    request_join: str | None
    causes: str  # the facts found, comma-separated ("none")
    facts: list[str]
    blocks_lost_in_pause: int
    tokens_lost_in_pause: int
    instance: str | None  # where its prefill ran
    routed_tokens: int
    routed_from: str | None
    preemptions: int
    invalidation_reasons: str
    max_queue_s: float | None
    num_requests: int
    cached_tokens: float | None
    unreached: str | None  # a step with no request in the store: why the store can say it never reached the server
    parts: StepParts


_FACT_FIELDS = tuple(f.name for f in fields(StepFacts) if f.name != "parts")
_WHEN = ("preemption", "never_scheduled", "reached_after_s")
_PART_COLUMNS = ("latency_s", *PARTS, *ESTIMATES, "new_prefill_s", "decoded_tokens", *_WHEN)


def facts_frame(rows: list[StepFacts]) -> pd.DataFrame:
    """The steps' facts as columns, their parts flattened beside them (`prefill_rate`: the prefill's own pace)."""
    columns = {name: [getattr(row, name) for row in rows] for name in _FACT_FIELDS}
    columns.update({name: [getattr(row.parts, name) for row in rows] for name in _PART_COLUMNS})
    columns["prefill_rate"] = [row.parts.own_rate for row in rows]
    return pd.DataFrame(columns)


def _routing_loss(reqs, sent, routed: dict) -> dict | None:
    """The largest routing loss among the step's requests, if any."""
    found = [routed[rid] for rid in reqs.request_id[sent] if rid in routed]
    return max(found, key=lambda row: row["routed_tokens"]) if found else None


def _distinct(hashes, tokens) -> tuple[int, int]:
    """Blocks and their tokens, each block once however many rows (owners) recorded its loss."""
    seen, total = set(), 0
    for block_hash, n in zip(hashes, tokens):
        key = None if missing(block_hash) else block_hash
        if key not in seen:
            seen.add(key)
            total += 0 if np.isnan(n) else int(n)
    return len(seen - {None}), total
